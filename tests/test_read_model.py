"""Every reader of the store selects the same runs: the latest finished logical run of every cell key
(a cell id on one GPU). The regressions, the compatibility table and every dashboard page judge those
logical runs; ``summary`` lists one run of each of them and ``report`` reads its rows from their
members, so no page or command can show a run another one does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.site import build_site
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
