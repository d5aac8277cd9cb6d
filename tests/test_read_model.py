"""Every reader of the store selects the same runs: the latest finished logical run of every cell key
(a cell id on one GPU). The regressions, the compatibility table and every dashboard page judge those
logical runs; ``summary`` lists one run of each of them and ``report`` reads its rows from their
members, so no page or command can show a run another one does not. They all select through
``matrix.readmodel.select_runs``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from dashboards.site import build_site
from matrix import readmodel
from matrix.compatibility import build_table
from matrix.regressions import report as regressions
from matrix.regressions.thresholds import Thresholds
from matrix.report import build_report
from matrix.store.db import open_store
from matrix.store.models import RunStatus
from matrix.summary import summarize
from matrix.transfer import ingest_jsonl
from matrix_cli.commands import pi_status

RESULTS = sorted((Path(__file__).resolve().parent.parent / "results").glob("*.jsonl"))


@pytest.mark.skipif(not RESULTS, reason="no committed results under results/")
def test_every_reader_selects_the_same_runs() -> None:
    store = open_store("sqlite://")
    with store.begin() as session:
        for path in RESULTS:
            with path.open("rb") as handle:
                ingest_jsonl(session, handle, str(path))
    with store() as session:
        judged = regressions.detect(session, Thresholds())
        logical = {cell.run.cell_key: set(cell.run.uids) for cell in judged.cells}
        members = set().union(*logical.values())
        table = build_table(session)
        site = build_site(session, Thresholds())
        summaries = summarize(session)
        report = build_report(session)
    assert len(logical) > 2 and any(len(uids) > 1 for uids in logical.values())  # logical runs exist
    assert {u for row in table.rows for u in row.run_uids} == members
    assert {row.run.cell_key: set(row.run.uids) for row in site.grid} == logical
    assert {v.run.cell_key for v in site.regressions} <= set(logical)
    listed = {(s.cell_id, s.gpu) for s in summaries}
    assert len(listed) == len(summaries) == len(logical)  # one line per cell key, none twice
    assert {s.uid for s in summaries} <= members
    assert {r.uid for r in report.runs} <= members


@pytest.mark.skipif(not RESULTS, reason="no committed results under results/")
def test_every_reader_goes_through_the_one_selector(monkeypatch: pytest.MonkeyPatch) -> None:
    """A selector that hides one cell key hides it from every reader: none selects runs on its own."""
    store = open_store("sqlite://")
    with store.begin() as session:
        for path in RESULTS:
            with path.open("rb") as handle:
                ingest_jsonl(session, handle, str(path))
    with store() as session:
        hidden = regressions.detect(session, Thresholds()).cells[0].run.cell_key
        keys = {r.uid: r.cell_key for r in readmodel.load_runs(session)}
    real = readmodel.select_runs
    calls: list[readmodel.Pick] = []

    def hiding(runs: Sequence[readmodel.RunInfo], selection: readmodel.Selection) -> list[readmodel.RunInfo]:
        calls.append(selection.pick)
        return [r for r in real(runs, selection) if r.cell_key != hidden]

    monkeypatch.setattr(readmodel, "select_runs", hiding)
    readers: dict[str, Callable[[Session], set[str]]] = {
        "regressions": lambda s: {c.run.cell_key for c in regressions.detect(s, Thresholds()).cells},
        "compatibility": lambda s: {readmodel.cell_key(r.cell_id, r.gpu_name) for r in build_table(s).rows},
        "dashboard": lambda s: {row.run.cell_key for row in build_site(s, Thresholds()).grid},
        "summary": lambda s: {readmodel.cell_key(x.cell_id, x.gpu) for x in summarize(s)},
        "report": lambda s: {r.cell_key for r in build_report(s).runs},
        "pi-status": lambda s: {keys[row.run] for row in pi_status.load_rows(s)},
    }
    with store() as session:
        for name, reader in readers.items():
            calls.clear()
            shown = reader(session)
            assert calls, f"{name} did not call readmodel.select_runs"
            assert shown and hidden not in shown, f"{name} selected runs on its own"


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _run(pk: int, cell: str, label: str | None, status: RunStatus = RunStatus.COMPLETE) -> readmodel.RunInfo:
    return readmodel.RunInfo(
        pk=pk,
        uid=f"{pk:04d}-uid",
        cell_id=cell,
        cell_key=readmodel.cell_key(cell, "H200"),
        kind="venv",
        torch_version="2.13.0",
        triton_version="3.7.1",
        cuda_runtime="13.0",
        gpu_name="H200",
        started_at=T0 + dt.timedelta(hours=pk),
        status=status,
        label=label,
    )


RUNS = [
    _run(1, "a", "n1"),
    _run(2, "a", "n1"),  # the second part of night n1 of cell a
    _run(3, "b", None),
    _run(4, "a", "n2", RunStatus.RUNNING),
    _run(5, "b", "n2", RunStatus.CRASHED),
]


def test_picks() -> None:
    def pick(pick: readmodel.Pick, **filters: tuple[str, ...]) -> list[tuple[str, ...]]:
        return [r.uids for r in readmodel.select_runs(RUNS, readmodel.Selection(pick=pick, **filters))]

    every = [r.uids for r in RUNS]
    assert pick(readmodel.Pick.EVERY) == every
    assert pick(readmodel.Pick.LOGICAL) == [("0001-uid", "0002-uid"), *every[2:]]
    # the latest finished logical run per cell key: a's n2 is still running, b's crashed run counts
    assert pick(readmodel.Pick.LATEST) == [("0001-uid", "0002-uid"), ("0005-uid",)]
    assert pick(readmodel.Pick.NEWEST) == [("0004-uid",), ("0005-uid",)]  # finished or not
    assert pick(readmodel.Pick.MERGED, labels=("n2",)) == [("0004-uid",), ("0005-uid",)]
    assert pick(readmodel.Pick.MERGED, cells=("a",)) == [("0001-uid", "0002-uid", "0004-uid")]
    assert pick(readmodel.Pick.EVERY, uids=("0003-uid",)) == [("0003-uid",)]
    merged = readmodel.select_runs(RUNS, readmodel.Selection(cells=("a",), pick=readmodel.Pick.MERGED))
    assert merged[0].status is RunStatus.RUNNING and merged[0].started_at == RUNS[0].started_at


def test_specs_name_logical_runs() -> None:
    def spec(text: str) -> list[tuple[str, ...]]:
        chosen = readmodel.select_runs(RUNS, readmodel.Selection(spec=text, pick=readmodel.Pick.LOGICAL))
        return [r.uids for r in chosen]

    assert spec("0002-uid") == [("0001-uid", "0002-uid")]  # a member's uid names its logical run
    assert spec("n2") == [("0004-uid",), ("0005-uid",)]
    assert spec("0003") == [("0003-uid",)] and spec("000") == []  # prefixes of 4+ characters only


def test_streak_starts_after_the_last_run_that_was_not_broken() -> None:
    history = [_run(pk, "a", None) for pk in range(1, 7)]
    history[4] = _run(5, "a", None, RunStatus.RUNNING)
    broken = {2, 4, 6}  # ok, broken, ok, broken, (running), broken
    since = readmodel.streak_start(history, history[-1], lambda r: r.pk in broken)
    assert since.pk == 4  # the running run is passed over; run 3 was fine
    assert readmodel.streak_start(history, history[1], lambda r: r.pk in broken).pk == 2


def test_run_status_reads_as_stored() -> None:
    assert f"{RunStatus.INSTALL_FAILED}" == str(RunStatus.INSTALL_FAILED) == "install_failed"
    assert RUNS[3].finished is False and RUNS[4].finished is True
