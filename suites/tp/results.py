"""The JSON file a TP run writes per workload, and the reader that refuses what it cannot read.

Problem: a TP run happens on a multi-GPU machine that may be lent for minutes; its results must come back
as one self-describing file per workload that a later stage (a report, the matrix store) can read without
the code that produced it, and a reader of an older grace-matrix must not misread a newer file.

Design: plain frozen dataclasses, turned into named JSON fields by ``to_dict`` (never positional rows).
The file carries ``format`` and ``format_version``; ``read_results`` refuses another format or a newer
version with a hint. Statuses are ``suites.records.CorrectnessStatus`` values (``pass``,
``fail_accuracy``, ``fail_to_run``, ``skip``...); every ``skip`` and failure carries its reason.

Layout (format_version 1)::

    {format, format_version, created_at, command, torch, device, backend, world_size, dtype,
     workload: {name, tier, description, size, code_hash},
     tolerance: {rtol, atol, fp64_multiplier, fp64_floor_divisor},
     sharding: {status, why, figures}          # TP eager in float64 vs unsharded float64, rank 0
     reference: {status, why}                  # unsharded eager run twice must agree
     modes: {mode: {status, reason, runs_as, compile_s, compile_facts, errors: {rank: text},
                    checks: {inputs|moved_inputs: [{rank, status, why, figures}]}, grace_graphs}},
     timing: {status, reason, samples, rule, samples_ms: {mode: {rank: [ms]}}, step_ms: {mode: [ms]},
              median_ms: {mode: ms}, speedup_vs_inductor: {mode: x}, speedup_vs_pt2cg: {mode: x},
              errors: {mode: text}}}
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from suites.records import CorrectnessStatus

TP_FORMAT = "grace-matrix.tp-results"
TP_FORMAT_VERSION = 1


class TPResultsError(ValueError):
    """A results file that is not a TP results file or is newer than this reader."""


@dataclass(frozen=True)
class RankCheck:
    """One rank's verdict on one input set against the unsharded reference."""

    rank: int
    status: str
    why: str
    figures: dict[str, float | None] = field(default_factory=dict)


@dataclass
class ModeResult:
    mode: str
    status: CorrectnessStatus
    reason: str = ""
    runs_as: str = ""  # the suites mode that actually ran (grace on a CPU runs grace's no-CUDA path)
    compile_s: float | None = None  # first call, slowest rank
    compile_facts: dict[str, int] = field(default_factory=dict)  # Dynamo/Inductor counter deltas, rank 0
    errors: dict[int, str] = field(default_factory=dict)
    checks: dict[str, list[RankCheck]] = field(default_factory=dict)
    grace_graphs: dict[int, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["errors"] = {str(k): v for k, v in self.errors.items()}
        out["grace_graphs"] = {str(k): v for k, v in self.grace_graphs.items()}
        return out


@dataclass
class TimingResult:
    status: str  # "ok" or "skip" (PerformanceStatus values)
    reason: str = ""
    samples: int = 0
    rule: str = ""
    samples_ms: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    median_ms: dict[str, float] = field(default_factory=dict)
    speedup_vs_inductor: dict[str, float] = field(default_factory=dict)
    speedup_vs_pt2cg: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["samples_ms"] = {
            m: {str(r): s for r, s in by_rank.items()} for m, by_rank in self.samples_ms.items()
        }
        return out


@dataclass
class TPRunResult:
    workload: dict[str, Any]
    world_size: int
    device: str
    backend: str
    dtype: str
    torch: str
    created_at: str
    command: str
    tolerance: dict[str, float]
    reference: dict[str, Any]
    sharding: dict[str, Any]
    modes: dict[str, ModeResult]
    timing: TimingResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TP_FORMAT,
            "format_version": TP_FORMAT_VERSION,
            "created_at": self.created_at,
            "command": self.command,
            "torch": self.torch,
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "dtype": self.dtype,
            "workload": self.workload,
            "tolerance": self.tolerance,
            "reference": self.reference,
            "sharding": self.sharding,
            "modes": {name: result.to_dict() for name, result in self.modes.items()},
            "timing": self.timing.to_dict(),
        }


def result_path(out_dir: Path, workload: str, world_size: int, device_type: str) -> Path:
    return out_dir / f"{workload}-tp{world_size}-{device_type}.json"


def write_results(result: TPRunResult, out_dir: Path) -> Path:
    """Write ``result`` atomically (a reader never sees half a file); returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = result_path(out_dir, result.workload["name"], result.world_size, result.device.split(":")[0])
    tmp = path.with_suffix(".json.tmp")
    text = json.dumps(_finite(result.to_dict()), indent=1, sort_keys=True, allow_nan=False)
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return path


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON readers reject NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def read_results(path: Path) -> dict[str, Any]:
    """The results in ``path`` as a dict; refuses other formats and newer versions."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TPResultsError(f"cannot read TP results {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != TP_FORMAT:
        raise TPResultsError(f"{path} is not a TP results file (format {TP_FORMAT!r} expected)")
    version = data.get("format_version")
    if not isinstance(version, int) or version > TP_FORMAT_VERSION:
        raise TPResultsError(
            f"{path} has TP results format version {version!r}; this grace-matrix reads up to "
            f"{TP_FORMAT_VERSION}: upgrade grace-matrix"
        )
    return data
