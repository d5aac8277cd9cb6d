"""Expected statuses as data: ``expected.toml`` at the repository root, loaded into the store.

Problem: known failures differ per cell (a mode that cannot run on torch 2.4, a PI stage that breaks on
one Triton version) and change as fixes land. They must be reviewed like code but read by the dashboards,
which render from the store alone.

Design: the file is the source of truth. ``load_expected_file`` parses and validates it into
``Expectation`` values; ``sync_expected`` replaces the ``ExpectedStatus`` table with them in the caller's
transaction, so the store always holds exactly one version of the file.

File format (version 1)::

    format = 1
    [[expected]]
    cells = "torch-2.4*"          # fnmatch pattern over matrix cell ids (default "*")
    suite = "correctness"         # correctness | performance | pi | tests
    workload = "vision_maskrcnn"  # fnmatch pattern; for pi: the subject; for tests: a node id or "<run>"
    mode = "pt2cg"                # fnmatch pattern; for pi: the stage; for tests: "pytest"
    status = "fail_to_run"        # the status the suite writes (suites.records enums)
    flaky = false                 # true: a mismatch is FLAKY and never fails a run
    reason = "why, with a link"   # required: an expectation without a reason cannot be reviewed

Invariants: statuses are validated against the suites' enums; one entry per (cells, suite, workload, mode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from matrix.regressions.errors import RegressionsConfigError, check_format, read_config_toml
from matrix.regressions.observations import PASSING_STATUS, TEST_FAILURES, TEST_MODE, Suite
from matrix.regressions.status import Expectation
from matrix.store.models import ExpectedStatus, RunStatus
from suites.records import CorrectnessStatus, PerformanceStatus, PIStage, StageStatus

EXPECTED_FORMAT = 1
DEFAULT_FILE = "expected.toml"

_STATUSES: dict[Suite, frozenset[str]] = {
    Suite.CORRECTNESS: frozenset(s.value for s in CorrectnessStatus),
    Suite.PERFORMANCE: frozenset(s.value for s in PerformanceStatus),
    Suite.PI: frozenset(s.value for s in StageStatus),
    # pytest's outcomes of a test, and how a run ended (Note: [Every outcome reaches a verdict])
    Suite.TESTS: frozenset({PASSING_STATUS[Suite.TESTS], *TEST_FAILURES})
    | frozenset(s.value for s in RunStatus if s not in (RunStatus.RUNNING, RunStatus.COMPLETE)),
}
_KEYS = {"cells", "suite", "workload", "mode", "status", "flaky", "reason"}


def _entry(item: Mapping[str, Any], where: str) -> Expectation:
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise RegressionsConfigError(f"{where}: unknown keys {unknown}; expected some of {sorted(_KEYS)}")
    for required in ("suite", "workload", "mode", "status", "reason"):
        if not isinstance(item.get(required), str) or not item[required]:
            raise RegressionsConfigError(f"{where}: {required!r} must be a non-empty string")
    try:
        suite = Suite(item["suite"])
    except ValueError:
        raise RegressionsConfigError(
            f"{where}: suite {item['suite']!r} is not one of {[s.value for s in Suite]}"
        ) from None
    status = item["status"]
    if status not in _STATUSES[suite]:
        raise RegressionsConfigError(
            f"{where}: status {status!r} is not a {suite.value} status; use one of {sorted(_STATUSES[suite])}"
        )
    mode = item["mode"]
    stages = {s.value for s in PIStage}
    if suite is Suite.PI and not any(ch in mode for ch in "*?[") and mode not in stages:
        raise RegressionsConfigError(f"{where}: PI stage {mode!r} is not one of {sorted(stages)}")
    if suite is Suite.TESTS and not any(ch in mode for ch in "*?[") and mode != TEST_MODE:
        raise RegressionsConfigError(f"{where}: the tests suite has one mode, {TEST_MODE!r}, not {mode!r}")
    cells = item.get("cells", "*")
    flaky = item.get("flaky", False)
    if not isinstance(cells, str) or not cells:
        raise RegressionsConfigError(f"{where}: 'cells' must be a non-empty fnmatch pattern string")
    if not isinstance(flaky, bool):
        raise RegressionsConfigError(f"{where}: 'flaky' must be true or false")
    return Expectation(cells, suite, item["workload"], mode, status, flaky, item["reason"])


def expectations_from_mapping(data: Mapping[str, Any], source: str = "<expected>") -> list[Expectation]:
    fmt = data.get("format")
    if fmt is None:
        raise RegressionsConfigError(f"{source}: missing 'format = {EXPECTED_FORMAT}' at the top of the file")
    check_format(fmt, EXPECTED_FORMAT, source)
    unknown = sorted(set(data) - {"format", "expected"})
    if unknown:
        raise RegressionsConfigError(
            f"{source}: unknown top-level keys {unknown}; entries go in [[expected]] tables"
        )
    items = data.get("expected", [])
    if not isinstance(items, list):
        raise RegressionsConfigError(f"{source}: 'expected' must be an array of tables ([[expected]])")
    entries: list[Expectation] = []
    seen: dict[tuple[str, str, str, str], int] = {}
    for i, item in enumerate(items):
        where = f"{source}: expected[{i}]"
        if not isinstance(item, Mapping):
            raise RegressionsConfigError(f"{where}: must be a table")
        entry = _entry(item, where)
        ident = (entry.cell_pattern, entry.suite.value, entry.workload, entry.mode)
        if ident in seen:
            raise RegressionsConfigError(
                f"{where}: duplicates expected[{seen[ident]}] (same cells, suite, workload, mode)"
            )
        seen[ident] = i
        entries.append(entry)
    return entries


def load_expected_file(path: Path | str) -> list[Expectation]:
    path = Path(path)
    return expectations_from_mapping(read_config_toml(path, "expected statuses"), str(path))


def sync_expected(session: Session, expectations: Sequence[Expectation]) -> int:
    """Replace the ExpectedStatus table with ``expectations`` (inside the caller's transaction)."""
    session.execute(delete(ExpectedStatus))
    session.add_all(
        ExpectedStatus(
            cell_pattern=e.cell_pattern,
            suite=e.suite.value,
            workload=e.workload,
            mode=e.mode,
            status=e.status,
            flaky=e.flaky,
            reason=e.reason,
        )
        for e in expectations
    )
    session.flush()
    return len(expectations)
