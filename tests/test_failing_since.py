"""A broken cell says since when it is broken: the first run of its cell key's streak of broken runs
(``report.CellReport.failing_since``, Note: [Failing since]), shown on the index and by
``summary --check``.

The store: torch-2.9's mt5_small fails from night 10 of 12 on (ok ... ok, broken, broken), torch-2.10's
PI subject from the last night only, torch-2.11 never."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from dashboards.render import write_site
from dashboards.site import build_site
from matrix.readmodel import RunInfo, load_runs
from matrix.regressions import report
from matrix.regressions.broken import broken_cells
from matrix.regressions.synthetic import SeededFailure, SyntheticSpec, seed_history
from matrix.regressions.thresholds import Thresholds
from matrix.store.db import open_store
from matrix_cli.main import main

TH = Thresholds()
SPEC = SyntheticSpec(
    nights=12,
    failures=(
        SeededFailure("torch-2.9", "correctness", "mt5_small", "grace", "fail_accuracy", "max_abs 0.3", 10),
        SeededFailure("torch-2.10", "pi", "triton_poi_fused_add_0", "assemble", "fail", "ptxas died", 11),
    ),
)


@pytest.fixture(scope="module")
def store() -> sessionmaker[Session]:
    factory = open_store("sqlite://")
    with factory.begin() as session:
        seed_history(session, SPEC)
    return factory


def _night(runs: list[RunInfo], cell_id: str, night: int) -> RunInfo:
    day = SPEC.start + dt.timedelta(days=night)
    (run,) = [r for r in runs if r.cell_id == cell_id and r.started_at.date() == day.date()]
    return run


def test_the_streak_starts_at_the_first_broken_run(store: sessionmaker[Session]) -> None:
    with store() as session:
        runs = load_runs(session)
        cells = {c.run.cell_id: c for c in report.detect(session, TH).cells}
    first_broken = _night(runs, "torch-2.9", 10)
    assert cells["torch-2.9"].failing_since is not None
    assert cells["torch-2.9"].failing_since.uid == first_broken.uid  # not night 11, not night 9 (ok)
    tonight = cells["torch-2.10"].run
    assert (
        cells["torch-2.10"].failing_since is not None and cells["torch-2.10"].failing_since.uid == tonight.uid
    )
    assert cells["torch-2.11"].failing_since is None and not cells["torch-2.11"].broken


def test_broken_cells_say_since_when(store: sessionmaker[Session]) -> None:
    with store() as session:
        runs = load_runs(session)
        broken = {b.cell_id: b for b in broken_cells(report.detect(session, TH), TH.status.fail_on)}
    since = _night(runs, "torch-2.9", 10)
    assert broken["torch-2.9"].since_text == (
        f"failing since {since.started_at:%Y-%m-%d %H:%M} UTC ({since.short_sha})"
    )
    assert since.short_sha and len(since.short_sha) == 9


def test_index_shows_failing_since_with_a_link_to_the_change(
    store: sessionmaker[Session], tmp_path: Path
) -> None:
    with store() as session:
        runs = load_runs(session)
        site = build_site(session, TH)
    write_site(site, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    since, before = _night(runs, "torch-2.9", 10), _night(runs, "torch-2.9", 9)
    (row,) = [g for g in site.grid if g.run.cell_id == "torch-2.9"]
    assert row.failing_since is not None and row.failing_since.uid == since.uid
    assert row.before_failing is not None and row.before_failing.uid == before.uid
    assert f'<tr id="{since.anchor}">' in index  # the row summary --check points at
    (html,) = [
        m.group(0) for m in re.finditer(r'<tr id="[^"]+">.*?</tr>', index, re.S) if "torch-2.9 " in m.group(0)
    ]
    link = f"compare.html?a={before.uid}&amp;b={since.uid}"
    assert f'failing since <a href="{link}"' in html
    assert f"{since.started_at:%Y-%m-%d %H:%M} UTC</a> (<code>{since.short_sha}</code>)" in html
    (fine,) = [
        m.group(0)
        for m in re.finditer(r'<tr id="[^"]+">.*?</tr>', index, re.S)
        if "torch-2.11 " in m.group(0)
    ]
    assert "failing since" not in fine


def _seeded_file(tmp_path: Path, spec: SyntheticSpec) -> str:
    db = f"sqlite:///{tmp_path / 'store.sqlite'}"
    factory = open_store(db)
    with factory.begin() as session:
        seed_history(session, spec)
    return db


def test_summary_check_closes_with_the_verdict_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no expected.toml, no site/ here
    db = _seeded_file(tmp_path, SPEC)
    factory = open_store(db)
    with factory() as session:
        since = _night(load_runs(session), "torch-2.9", 10)
    assert main(["summary", "--db", db, "--check"]) == 1
    err = capsys.readouterr().err.splitlines()
    start = next(i for i, line in enumerate(err) if "verdict:" in line)
    block = err[start:]
    assert block[0] == "grace-matrix: verdict: 2 broken cell(s) of 3"
    assert 3 <= len(block) <= 10 and all(line.startswith("grace-matrix: ") for line in block)
    (line,) = [b for b in block if "torch-2.9 " in b]
    assert f"failing since {since.started_at:%Y-%m-%d %H:%M} UTC ({since.short_sha})" in line
    assert line.endswith(f"; row: site/index.html#{since.anchor}")
    assert any("torch-2.10 " in b for b in block) and not any("torch-2.11 " in b for b in block)
    assert block[-2].endswith("grace-matrix regressions --run synthetic-nightly-2026-01-12")
    assert (
        block[-1] == "grace-matrix: (site/index.html is not rendered yet: grace-matrix dashboard renders it)"
    )


def test_summary_check_says_ok_and_where_the_dashboard_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = _seeded_file(tmp_path, SyntheticSpec(nights=3))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html></html>", encoding="utf-8")
    assert main(["summary", "--db", db, "--check"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1] == "grace-matrix: verdict: ok (3 cell(s) judged, none broken); the dashboard: site/index.html"
    )
