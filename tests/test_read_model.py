"""Every reader of the store selects the same runs: the latest finished logical run of every cell key
(a cell id on one GPU). The regressions, the compatibility table and every dashboard page judge those
logical runs; ``summary`` lists one run of each of them and ``report`` reads its rows from their
members, so no page or command can show a run another one does not. They all select through
``matrix.readmodel.select_runs``."""

from __future__ import annotations

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
from matrix.summary import summarize
from matrix.transfer import ingest_jsonl

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
    }
    with store() as session:
        for name, reader in readers.items():
            calls.clear()
            shown = reader(session)
            assert calls, f"{name} did not call readmodel.select_runs"
            assert shown and hidden not in shown, f"{name} selected runs on its own"
