"""Test support: a small project of synthetic cells for the nightly pipeline.

``write_project`` lays out a matrix.toml of ``current`` cells and, per cell, one test module that emits a
known number of result records (performance, correctness and PI stage records with unicode, nested JSON,
64-bit integers and floats), skips some tests and fails others, and optionally kills its own process or
hangs at a given test, or first waits for other cells to start (so that cells provably run at once).
Each test appends its node id and the number of records it emitted to
``produced.txt`` of its cell before finishing: the witness of what the cell produced, independent of
the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_TEST_MODULE = """\
import os
import signal
import time

import pytest

from suites.records import (
    USER_PROPERTY_KEY,
    CorrectnessRecord,
    CorrectnessStatus,
    PerformanceRecord,
    PerformanceStatus,
    PIStage,
    PIStageRecord,
    StageStatus,
    WorkloadRef,
)

N, R, CRASH_AT, HANG_AT, SCALE, MEET = {tests}, {records}, {crash_at}, {hang_at}, {scale}, {meet}
MANIFEST = os.path.join(os.path.dirname(__file__), "produced.txt")
STARTED = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".started")


def _meet():
    # Wait (at most a minute) until MEET cells have reached their first test, so they run at once.
    os.makedirs(STARTED, exist_ok=True)
    open(os.path.join(STARTED, os.path.basename(os.path.dirname(__file__))), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(STARTED)) < MEET and time.monotonic() < deadline:
        time.sleep(0.05)


def _records(i):
    w = WorkloadRef("wl%d" % (i % 4), tier="smoke", tags=("synthetic",), code_hash="h%d" % (i % 2))
    kinds = [
        PerformanceRecord(
            w, "grace", PerformanceStatus.OK,
            samples_ms=tuple(SCALE * (0.5 + 0.01 * j + i) for j in range(5)), median_ms=SCALE * (0.52 + i),
            peak_mem_bytes=2**40 + i, details={{"i": i, "nested": {{"ok": True}}}},
        ),
        CorrectnessRecord(
            w, "grace", CorrectnessStatus.PASS, errors={{"max_abs": 1e-7 * i}}, tolerance={{"atol": 1e-4}}
        ),
        PIStageRecord(
            "kernel_%d" % i, PIStage.REWRITE, StageStatus.PASS, message="ok \\u00fcn\\u00efcode",
            triton_version="3.7.1",
        ),
    ]
    return [kinds[(i + k) % len(kinds)] for k in range(R)]


@pytest.mark.parametrize("i", range(N))
def test_synthetic(request, i):
    if i == 0 and MEET:
        _meet()
    if i == CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if i == HANG_AT:
        time.sleep(600)
    for record in _records(i):
        request.node.user_properties.append((USER_PROPERTY_KEY, record.to_property()))
    with open(MANIFEST, "a", encoding="utf-8") as manifest:
        manifest.write("%s %d\\n" % (request.node.nodeid, R))
    if i % 7 == 3:
        pytest.skip("synthetic skip")
    assert i % 11 != 5, "synthetic failure"
"""


@dataclass(frozen=True)
class SyntheticCell:
    id: str
    tests: int
    records: int
    crash_at: int = -1  # this test kills its own process
    hang_at: int = -1  # this test sleeps for ten minutes
    scale: float = 1.0  # performance samples and medians are multiplied by this
    meet: int = 0  # the first test waits until this many cells have started theirs

    @property
    def directory(self) -> str:
        return f"cells/{self.id}"


def write_project(root: Path, cells: list[SyntheticCell]) -> Path:
    """The project's matrix.toml path; each cell's tests live in ``cells/<id>/`` (rewritten if present)."""
    lines = ["format = 1", 'default_tag = "nightly"', "", "[defaults]", 'tags = ["nightly"]', ""]
    for cell in cells:
        lines += ["[[cells]]", f'id = "{cell.id}"', 'kind = "current"', f'paths = ["{cell.directory}"]', ""]
        directory = root / cell.directory
        directory.mkdir(parents=True, exist_ok=True)
        module = _TEST_MODULE.format(
            tests=cell.tests,
            records=cell.records,
            crash_at=cell.crash_at,
            hang_at=cell.hang_at,
            scale=cell.scale,
            meet=cell.meet,
        )
        (directory / f"test_{cell.id.replace('-', '_')}.py").write_text(module, encoding="utf-8")
    config = root / "matrix.toml"
    config.write_text("\n".join(lines), encoding="utf-8")
    (root / "expected.toml").write_text(_EXPECTED, encoding="utf-8")
    return config


# The synthetic failures (``assert i % 11 != 5``) fail after recording passing results: expected, so a
# nightly of synthetic cells is broken only by what a test asks for (a crash, a hang).
_EXPECTED = """\
format = 1

[[expected]]
suite = "tests"
workload = "cells/*::test_synthetic[[]*]"
mode = "pytest"
status = "failed"
reason = "the synthetic cells fail every test i with i % 11 == 5 on purpose"
"""


def produced(root: Path, cell: SyntheticCell) -> dict[str, int]:
    """What the cell's tests say they emitted: node id -> number of records."""
    path = root / cell.directory / "produced.txt"
    if not path.exists():
        return {}
    out: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        nodeid, count = line.rsplit(" ", 1)
        assert nodeid not in out, f"{nodeid} ran twice"
        out[nodeid] = int(count)
    return out


def expected_keys(root: Path, cell: SyntheticCell) -> dict[str, set[str]]:
    """The record keys the store must hold for the cell: outcomes by node id, records ``<nodeid>#<n>``."""
    made = produced(root, cell)
    return {
        "test_outcomes": set(made),
        "records": {f"{nodeid}#{n}" for nodeid, count in made.items() for n in range(count)},
    }
