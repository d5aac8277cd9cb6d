"""The summary: latest run per cell, counts by grouped queries, stale runs reaped first."""

from __future__ import annotations

import os
import subprocess
import sys

from matrix.fingerprint import Environment
from matrix.store.access import get_or_create_cell, start_run
from matrix.store.db import open_store
from matrix.store.models import PIStageResult
from matrix.store.models import TestOutcome as Outcome
from matrix.summary import headline, summarize


def env(cell_id: str) -> Environment:
    return Environment(
        cell_id, "venv", "2.4.1", "3.0.0", "12.1", None, None, None, "3.11.7", "Linux-x86_64", {}
    )


def test_latest_run_per_cell_with_counts_and_stale_runs_crashed() -> None:
    Session = open_store("sqlite://")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Session.begin() as s:
        old = start_run(s, get_or_create_cell(s, env("torch-2.4")), label="n1")
        new = start_run(s, get_or_create_cell(s, env("torch-2.4")), label="n2", pid=dead.pid)
        other = start_run(s, get_or_create_cell(s, env("triton-3.0")), label="n2", pid=os.getpid())
        for i, outcome in enumerate(["passed", "passed", "failed"]):
            s.add(Outcome(run=new, record_key=f"t{i}", nodeid=f"t{i}", outcome=outcome))
        s.add(PIStageResult(run=new, record_key="t0#0", subject="k", stage="rewrite", status="pass"))
        old_uid, new_uid, other_uid = old.uid, new.uid, other.uid
    with Session.begin() as s:
        summaries = {x.cell_id: x for x in summarize(s)}
    assert summaries["torch-2.4"].uid == new_uid
    assert summaries["torch-2.4"].outcomes == {"passed": 2, "failed": 1}
    assert summaries["torch-2.4"].records == {"pi_stage": 1}
    assert summaries["torch-2.4"].status == "crashed"  # its process is gone
    assert summaries["triton-3.0"].status == "running"  # this process is alive
    with Session.begin() as s:
        assert {x.uid for x in summarize(s, labels=["n1", "n2"], latest_only=False)} == {
            old_uid,
            new_uid,
            other_uid,
        }
        assert [x.uid for x in summarize(s, cells=["triton-3.0"])] == [other_uid]


def test_headline() -> None:
    assert headline(None) is None
    message = "install torch==9 exited with 1:\nCollecting x\nERROR: No matching distribution\nERROR: other"
    assert headline(message) == "install torch==9 exited with 1: ERROR: No matching distribution"
    assert len(headline("x" * 500)) == 100
