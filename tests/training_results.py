"""Test support: a store of training and inference results, ingested the way exported runs are.

``training_store`` writes, per run, the export lines ``grace-matrix export`` writes (the run and its cell
from a scratch store, then the suites' records as result rows) and ingests them with ``grace-matrix
ingest`` into an SQLite file. The figures are the module constants below, so that tests derive what the
training view must show from them instead of repeating numbers.

Content, cell ``torch-2.11`` (H200):
- run ``inference``: DistilGPT2 (standard) in inductor, pt2cg and grace;
- run ``training`` (later): DistilGPT2_train with phases in every mode, inductor faster than pt2cg;
  DistilGPT2_train_amp without phases (its profile failed); BertForMaskedLM_train, whose grace timing
  failed (``FAILED_REASON``) and which has no inference workload.
Cell ``torch-2.10`` (H200): XLNetLMHeadModel_train only; its twin ran in no run of that cell.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

from store_content import environment

from matrix.store.access import finish_run, get_or_create_cell, start_run
from matrix.store.db import open_store
from matrix.store.models import RunStatus
from matrix.transfer import export_jsonl
from matrix_cli.main import main
from suites.records import (
    CorrectnessRecord,
    CorrectnessStatus,
    PerformanceRecord,
    PerformanceStatus,
    Record,
    WorkloadRef,
)

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
MIB = 1 << 20
TAGS = ("transformer", "launch_bound")
TRAINING_TAGS = ("training", *TAGS)
INFERENCE_MS = {"inductor": 2.0, "pt2cg": 1.5, "grace": 1.2}
TRAIN_MS = {"eager": 30.0, "inductor": 18.0, "pt2cg": 20.0, "grace": 16.0}
AMP_MS = {"pt2cg": 8.0, "grace": 12.5}
BERT_MS = {"pt2cg": 5.0}  # grace: timing failed
FAILED_REASON = "timing: CUDA error: an illegal memory access"
PHASES = {  # DistilGPT2_train: kernels in graphs per phase and mode
    "eager": {"forward": 0, "backward": 0, "optimizer": 0},
    "inductor": {"forward": 0, "backward": 0, "optimizer": 0},
    "pt2cg": {"forward": 69, "backward": 196, "optimizer": 0},
    "grace": {"forward": 70, "backward": 198, "optimizer": 0},
}
PEAKS = {"pt2cg": 1200 * MIB, "grace": 1800 * MIB}  # DistilGPT2_train's calls' peak
CELL, OTHER_CELL = "torch-2.11", "torch-2.10"


def _phases(mode: str) -> dict[str, Any]:
    return {
        phase: {"kernels_in_graphs": kernels, "kernel_launches": 3, "graph_launches": int(kernels > 0)}
        for phase, kernels in PHASES[mode].items()
    }


def _performance(ref: WorkloadRef, mode: str, ms: float | None, **details: Any) -> PerformanceRecord:
    if ms is None:
        return PerformanceRecord(ref, mode, PerformanceStatus.FAIL_TO_RUN, reason=FAILED_REASON)
    phases = details.get("phases", {})
    kernels = sum(p["kernels_in_graphs"] for p in phases.values()) if phases else 7
    return PerformanceRecord(
        ref, mode, PerformanceStatus.OK, samples_ms=(ms,) * 5, median_ms=ms, kernels_in_graphs=kernels,
        kernel_launches=3, graph_launches=1, details=details,
    )  # fmt: skip


def _workload(ref: WorkloadRef, ms: dict[str, Any], **per_mode: Any) -> list[Record]:
    """Per mode a passing verdict and a performance record (``ms`` None: its timing failed); ``per_mode``:
    detail name -> function of the mode giving its value (None: not recorded)."""
    records: list[Record] = []
    for mode, median in ms.items():
        records.append(CorrectnessRecord(ref, mode, CorrectnessStatus.PASS))
        details = {key: value(mode) for key, value in per_mode.items() if value(mode) is not None}
        records.append(_performance(ref, mode, median, **details))
    return records


def _training(name: str) -> WorkloadRef:
    return WorkloadRef(name, tier="standard", tags=TRAINING_TAGS, code_hash="t1")


def _record_line(run_uid: str, index: int, record: Record) -> dict[str, Any]:
    """A record as an export line: the row the recorder makes of it (key ``<nodeid>#<n>``)."""
    body = record.to_property()
    kind = body.pop("kind")
    body.pop("format")
    nodeid = f"suites/test_{kind}.py::test_{kind}[{body['workload']['name']}]"
    return {
        "type": f"{kind}_results",
        "run": run_uid,
        "record_key": f"{nodeid}#{index}",
        "nodeid": nodeid,
        **body,
    }


def _export(cell_id: str, label: str, minutes: int, records: list[Record]) -> str:
    """The export text of one finished run of ``cell_id`` holding ``records``."""
    scratch = open_store("sqlite://")
    with scratch.begin() as session:
        run = start_run(
            session, get_or_create_cell(session, environment(cell_id)), label=label, command="pytest"
        )
        run.started_at = T0 + dt.timedelta(minutes=minutes)
        finish_run(session, run, RunStatus.COMPLETE, exit_code=0)
        uid = run.uid
    out = io.StringIO()
    with scratch() as session:
        export_jsonl(session, out)
    lines = [json.dumps(_record_line(uid, i, r), sort_keys=True) for i, r in enumerate(records)]
    return out.getvalue() + "\n".join(lines) + "\n"


def training_store(folder: Path) -> str:
    """The URL of a fresh SQLite store holding the content the module docstring lists."""
    inference = WorkloadRef("DistilGPT2", tier="standard", tags=TAGS, code_hash="i1")
    train = _workload(
        _training("DistilGPT2_train"), TRAIN_MS,
        phases=_phases, training_iteration=lambda m: True, calls_peak_mem_bytes=PEAKS.get,
    )  # fmt: skip
    amp = _workload(_training("DistilGPT2_train_amp"), AMP_MS)
    bert = _workload(_training("BertForMaskedLM_train"), {**BERT_MS, "grace": None})
    xlnet = _workload(_training("XLNetLMHeadModel_train"), TRAIN_MS)
    exports = {
        "inference.jsonl": _export(CELL, "inference", 0, _workload(inference, INFERENCE_MS)),
        "training.jsonl": _export(CELL, "training", 10, train + amp + bert),
        "other.jsonl": _export(OTHER_CELL, "training", 20, xlnet),
    }
    for name, text in exports.items():
        (folder / name).write_text(text, encoding="utf-8")
    url = f"sqlite:///{folder / 'store.sqlite'}"
    assert main(["ingest", "--db", url, *(str(folder / name) for name in exports)]) == 0
    return url
