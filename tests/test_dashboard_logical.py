"""The dashboards show the runs of one cell that share a label as one run (matrix.readmodel.group_runs):
one grid row, one point of history, one side of a comparison, the re-run's newer status winning.

The store is the one of tests/test_regressions_logical.py: the last night of torch-2.11 recorded as three
runs of one label, the third re-running a workload and a PI subject with changed statuses.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker
from test_regressions_logical import LABEL, LATER, PI_SUBJECT, RERUN, SPEC, Split, split_last_night

from dashboards.render import write_site
from dashboards.site import Site, build_site
from matrix.regressions.synthetic import seed_demo, seed_history
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store

CELL = "torch-2.11"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Site, Split, Path]:
    factory: sessionmaker[Session] = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
        split = split_last_night(session)
    with factory() as session:
        site = build_site(session, Thresholds())
    out = tmp_path_factory.mktemp("site") / "site"
    write_site(site, out)
    return site, split, out


def test_grid_row_is_the_whole_label(built: tuple[Site, Split, Path]) -> None:
    site, split, out = built
    (row,) = [g for g in site.grid if g.run.cell_id == CELL]
    assert row.run.uids == split.uids
    assert row.baseline is not None and row.baseline.uid == split.previous_uid
    counts = {s.suite: s.counts for s in row.suites}
    assert "MISSING" not in counts["correctness"] and "MISSING" not in counts["performance"]
    assert counts["correctness"] == {"PASS": len(SPEC.workloads) * len(SPEC.modes) - 1, "FAIL": 1}
    assert counts["pi"]["FAIL"] == 1
    # headline speedups over every workload of the night, not over the re-run's one
    speedup = {(s.mode, s.reference): s for s in row.speedups}
    assert speedup[("pt2cg", "inductor")].workloads == len(SPEC.workloads)
    # pytest outcomes counted once per test: run C's re-run replaces run A's outcome
    assert sum(row.outcomes.values()) == len(SPEC.workloads) * len(SPEC.modes)
    assert f"{LABEL} (3 runs)" in (out / "index.html").read_text()


def test_runs_history_and_comparison_use_the_logical_run(built: tuple[Site, Split, Path]) -> None:
    site, split, out = built
    mine = [r for r in site.runs if r.cell_id == CELL]
    assert len(mine) == SPEC.nights and mine[-1].uids == split.uids
    assert not any(r.uid in split.uids[:2] for r in site.runs)  # members are not runs of their own
    (digest,) = [d for d in site.digests if d.run.uid == split.uids[-1]]
    statuses = {(s, w, m): st for s, w, m, st, _ in digest.rows}
    assert len(statuses) == len(digest.rows)  # one row per result
    assert statuses[("correctness", RERUN, "grace")] == "fail_accuracy"
    assert statuses[("correctness", RERUN, "eager")] == "pass"  # run A's failure was fixed by run C
    assert statuses[("performance", LATER[-1], "grace")] == "ok"  # from run B
    assert statuses[("pi", PI_SUBJECT, "patch")] == "fail"
    pair = [p for p in site.pairs if p[1].uid == split.uids[-1]]
    assert len(pair) == 1 and pair[0][0].uid == split.previous_uid
    (chart,) = [
        c for w in site.workloads if w.name == LATER[0] for c in w.charts if c.cell_key.startswith(CELL)
    ]
    assert chart.svg.count("<circle") == SPEC.nights * len(SPEC.modes)  # one point per night and mode
    compare = next(p for p in (out / "compare").glob("*.html") if split.uids[-1] in p.read_text()).read_text()
    assert all(uid in compare for uid in split.uids)
    runs_page = (out / "runs.html").read_text()
    assert re.search(rf"{LABEL}<br><small[^>]*>3 runs</small>", runs_page)


def test_pi_page_shows_the_re_run_failure(built: tuple[Site, Split, Path]) -> None:
    site, _, out = built
    failures = [f for row in site.pi_rows for f in row.failures]
    assert [(f.cell_id, f.subject, f.stage) for f in failures] == [(CELL, PI_SUBJECT, "patch")]
    assert PI_SUBJECT in (out / "pi.html").read_text()


def test_seed_demo_clones_the_whole_logical_run() -> None:
    factory: sessionmaker[Session] = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
        split = split_last_night(session)
        seeded = seed_demo(session)
    with factory() as session:
        site = build_site(session, Thresholds())
    assert seeded.cell_id == CELL  # the split night of CELL is the latest logical run
    new = {(v.regression.kind.value, v.regression.key.workload) for v in site.regressions if v.regression.new}
    assert ("performance", seeded.regression[0]) in new
    (row,) = [g for g in site.grid if g.run.uid == seeded.run_uid]
    assert row.baseline is not None and row.baseline.uids == split.uids
    assert not any("MISSING" in s.counts for s in row.suites)


def test_seed_demo_takes_a_re_run_of_changed_code_over_the_older_result() -> None:
    """Run C re-ran RERUN after its code changed (another workload row, same name and tier): the clone
    carries run C's results for it, not both runs' (the older one as a stale failure beside it)."""
    from sqlalchemy import select
    from test_regressions_logical import RERUN

    from matrix.store.models import CorrectnessResult, Run, Workload

    factory: sessionmaker[Session] = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
        split = split_last_night(session)
        old = session.execute(select(Workload).where(Workload.name == RERUN)).scalars().one()
        changed = Workload(name=old.name, code_hash="changed-code", tier=old.tier, tags=list(old.tags or []))
        session.add(changed)
        session.flush()
        run_c = session.execute(select(Run).where(Run.uid == split.uids[-1])).scalars().one()
        for model in (CorrectnessResult,):
            for row in session.execute(select(model).where(model.run_pk == run_c.id)).scalars():
                row.workload_pk = changed.id
        session.flush()
        seeded = seed_demo(session)
        clone = session.execute(select(Run).where(Run.uid == seeded.run_uid)).scalars().one()
        rows = [
            (r.workload_pk, r.mode, r.status)
            for r in session.execute(
                select(CorrectnessResult).where(CorrectnessResult.run_pk == clone.id)
            ).scalars()
            if r.workload_pk in (old.id, changed.id)
        ]
    assert rows and {pk for pk, _, _ in rows} == {changed.id}
    assert len({mode for _, mode, _ in rows}) == len(rows)  # one result per mode
    assert dict((mode, status) for _, mode, status in rows)["grace"] == "fail_accuracy"  # run C's
