"""Where the nightly CI runs each cell: matrix/runners.toml loaded into frozen dataclasses.

Problem: the nightly workflow fans the cells of matrix.toml out over CI runners. Which runner a cell
needs follows from the cell (a venv cell needs a GPU and a driver for its CUDA variant; a Triton-only
cell needs neither), but the label names, the GPU model of the fleet, timeouts and the Python to set up
are facts about the fleet, not about the matrix. Hard-coding them in the workflow generator would make
every fleet change a code change, and writing them into the workflow by hand would let it drift.

Design: runners.toml holds, per cell kind, a template of runner labels (``gpu-{gpu}``, ``{cuda_variant}``)
and job settings, with per-cell overrides; ``RunnerConfig.profile_for(cell)`` resolves them into a
``RunnerProfile``. The workflow generator (matrix.ciplan) reads only profiles.

Invariants:
- A loaded ``RunnerConfig`` has a profile template for every cell kind and names only cells that exist
  in the matrix it was checked against (``check_against``): a stale override is an error, not a no-op.
- A resolved label contains no unfilled ``{field}``; a template naming a field the cell lacks (a CUDA
  variant for a Triton-only cell) is a ``ConfigError`` naming the cell and the label.
- Every failure is one ``ConfigError`` naming the file and the key path.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matrix.cells import CellKind, CellSpec, Matrix
from matrix.errors import ConfigError
from matrix.infiles import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

RUNNERS_FORMAT = 1
DEFAULT_RUNNERS_PATH = Path(__file__).with_name("runners.toml")

_LABEL_RE = re.compile(r"^[A-Za-z0-9_.{}-]+$")
_FIELD_RE = re.compile(r"\{([a-z_]+)\}")
_FIELDS = ("gpu", "cuda", "cuda_variant", "cell")
_CRON_RE = re.compile(r"^\S+( \S+){4}$")
_PYTHON_RE = re.compile(r"^3\.\d{1,2}$")


@dataclass(frozen=True)
class KindSettings:
    """The runner template and job settings of one cell kind (or one cell's overrides of them)."""

    runs_on: tuple[str, ...]
    timeout_minutes: int
    setup_python: bool
    platform: str


@dataclass(frozen=True)
class CellOverride:
    gpu: str | None = None
    runs_on: tuple[str, ...] | None = None
    timeout_minutes: int | None = None


@dataclass(frozen=True)
class RunnerProfile:
    """Where and how one cell's job runs: resolved labels, no templates left."""

    cell_id: str
    runs_on: tuple[str, ...]
    timeout_minutes: int
    setup_python: bool
    python: str | None  # the Python set up for the job; None: the runner's own interpreter
    platform: str


@dataclass(frozen=True)
class WorkflowSettings:
    name: str
    cron: str
    python: str
    export_retention_days: int
    history_retention_days: int
    pages: bool


@dataclass(frozen=True)
class ReportSettings:
    runs_on: tuple[str, ...]
    timeout_minutes: int
    extras: tuple[str, ...]


@dataclass(frozen=True)
class RunnerConfig:
    source: str
    workflow: WorkflowSettings
    gpu_model: str
    kinds: Mapping[CellKind, KindSettings]
    report: ReportSettings
    cells: Mapping[str, CellOverride] = field(default_factory=dict)

    def check_against(self, matrix: Matrix) -> None:
        """Refuse overrides for cells that matrix.toml does not declare."""
        for cell_id in self.cells:
            if cell_id not in matrix.ids:
                raise ConfigError(
                    f"{self.source}: cells.{cell_id}: no such cell in {matrix.source}; "
                    "remove the override or fix the id"
                )

    def profile_for(self, cell: CellSpec) -> RunnerProfile:
        kind = self.kinds[cell.kind]
        override = self.cells.get(cell.id, CellOverride())
        values = {
            "gpu": override.gpu or self.gpu_model,
            "cuda": cell.cuda,
            "cuda_variant": cell.cuda_variant,
            "cell": cell.id,
        }
        template = override.runs_on or kind.runs_on
        where = f"cells.{cell.id}.runs-on" if override.runs_on else f"kinds.{cell.kind.value}.runs-on"
        labels = tuple(self._fill(label, values, cell, where) for label in template)
        return RunnerProfile(
            cell_id=cell.id,
            runs_on=labels,
            timeout_minutes=override.timeout_minutes or kind.timeout_minutes,
            setup_python=kind.setup_python,
            python=self.workflow.python if kind.setup_python else None,
            platform=kind.platform,
        )

    def _fill(self, label: str, values: Mapping[str, str | None], cell: CellSpec, where: str) -> str:
        def one(match: re.Match[str]) -> str:
            value = values[match.group(1)]
            if value is None:
                raise ConfigError(
                    f"{self.source}: {where}: label {label!r} needs the cell's {match.group(1)}, "
                    f"which cell {cell.id!r} ({cell.kind.value}) does not have"
                )
            return value

        return _FIELD_RE.sub(one, label)


def load_runners(path: str | Path | None = None) -> RunnerConfig:
    path = Path(path) if path is not None else DEFAULT_RUNNERS_PATH
    try:
        data = tomllib.loads(read_text(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: runner file not found; pass --runners PATH") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the runner file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_runners(data, str(path))


class _Table:
    """Typed access to one TOML table; every error names the file and the key path."""

    def __init__(self, source: str, where: str, table: Any, allowed: tuple[str, ...]) -> None:
        self.source, self.where = source, where
        if not isinstance(table, Mapping):
            self.fail(f"expected a table, got {type(table).__name__}")
        self.table: Mapping[str, Any] = table
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}", unknown[0])

    def fail(self, problem: str, key: str | None = None) -> Any:
        path = ".".join(p for p in (self.where, key) if p) or "<top level>"
        raise ConfigError(f"{self.source}: {path}: {problem}")

    def get(self, key: str, kind: type, default: Any = None, required: bool = False) -> Any:
        if key not in self.table:
            if required:
                self.fail("is required", key)
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(f"expected {kind.__name__}, got {type(value).__name__} {value!r}", key)
        return value

    def positive(self, key: str, default: int | None = None, required: bool = False) -> Any:
        value = self.get(key, int, default, required)
        if value is not None and value <= 0:
            self.fail(f"must be a positive number, got {value}", key)
        return value

    def labels(self, key: str, required: bool = False) -> tuple[str, ...] | None:
        value = self.get(key, list, None, required)
        if value is None:
            return None
        if not value:
            self.fail("needs at least one label", key)
        for label in value:
            if not isinstance(label, str) or not _LABEL_RE.match(label):
                self.fail(f"{label!r} is not a runner label (letters, digits, '.', '_', '-', {{field}})", key)
            for name in _FIELD_RE.findall(label):
                if name not in _FIELDS:
                    self.fail(f"label {label!r} names {{{name}}}; known fields: {', '.join(_FIELDS)}", key)
        return tuple(value)


def parse_runners(data: Mapping[str, Any], source: str = "runners.toml") -> RunnerConfig:
    top = _Table(source, "", data, ("format", "workflow", "gpu", "kinds", "report", "cells"))
    fmt = top.get("format", int, required=True)
    if fmt > RUNNERS_FORMAT or fmt < 1:
        top.fail(f"format {fmt} is not one this grace-matrix reads ({RUNNERS_FORMAT})", "format")

    wf = _Table(
        source,
        "workflow",
        top.get("workflow", dict, required=True),
        ("name", "cron", "python", "export-retention-days", "history-retention-days", "pages"),
    )
    cron = wf.get("cron", str, required=True)
    if not _CRON_RE.match(cron):
        wf.fail(f"{cron!r} is not a cron expression of five fields", "cron")
    python = wf.get("python", str, required=True)
    if not _PYTHON_RE.match(python):
        wf.fail(f"{python!r} is not a Python version such as '3.12'", "python")
    workflow = WorkflowSettings(
        name=wf.get("name", str, "nightly"),
        cron=cron,
        python=python,
        export_retention_days=wf.positive("export-retention-days", 14),
        history_retention_days=wf.positive("history-retention-days", 90),
        pages=wf.get("pages", bool, True),
    )

    gpu = _Table(source, "gpu", top.get("gpu", dict, required=True), ("model",))
    gpu_model = gpu.get("model", str, required=True)

    kinds_table = _Table(
        source, "kinds", top.get("kinds", dict, required=True), tuple(k.value for k in CellKind)
    )
    kinds: dict[CellKind, KindSettings] = {}
    for kind in CellKind:
        if kind.value not in kinds_table.table:
            kinds_table.fail(f"every cell kind needs its runner; add [kinds.{kind.value}]")
        t = _Table(
            source,
            f"kinds.{kind.value}",
            kinds_table.table[kind.value],
            ("runs-on", "timeout-minutes", "setup-python", "platform"),
        )
        kinds[kind] = KindSettings(
            runs_on=t.labels("runs-on", required=True) or (),
            timeout_minutes=t.positive("timeout-minutes", required=True),
            setup_python=t.get("setup-python", bool, True),
            platform=t.get("platform", str, "linux-x86_64"),
        )

    rt = _Table(
        source, "report", top.get("report", dict, required=True), ("runs-on", "timeout-minutes", "extras")
    )
    report_labels = rt.labels("runs-on", required=True) or ()
    if any(_FIELD_RE.search(label) for label in report_labels):
        rt.fail("the report job belongs to no cell; its labels cannot name cell fields", "runs-on")
    extras = rt.get("extras", list, [])
    if not all(isinstance(e, str) and re.match(r"^[a-z0-9][a-z0-9._-]*$", e) for e in extras):
        rt.fail(f"{extras!r} is not a list of extra names", "extras")
    report = ReportSettings(report_labels, rt.positive("timeout-minutes", 30), tuple(extras))

    cells: dict[str, CellOverride] = {}
    cells_table = top.get("cells", dict, {})
    for cell_id, raw in cells_table.items():
        t = _Table(source, f"cells.{cell_id}", raw, ("gpu", "runs-on", "timeout-minutes"))
        cells[cell_id] = CellOverride(
            gpu=t.get("gpu", str), runs_on=t.labels("runs-on"), timeout_minutes=t.positive("timeout-minutes")
        )
    return RunnerConfig(source, workflow, gpu_model, kinds, report, cells)
