"""Result records: the one contract between the suites and whatever stores their results.

Problem: the suites run under pytest, often spread over pytest-xdist workers, and must hand every
measurement (a correctness verdict, a performance sample set, a parameter-indirection stage outcome, a
CGCT diagnostic) to the recording plugin without importing it (dependencies point down: matrix ->
suites -> grace).

Design: a test calls the ``grace_record`` fixture with one of the frozen dataclasses below. The fixture
appends ``(USER_PROPERTY_KEY, record.to_property())`` to the test item's ``user_properties``; pytest and
pytest-xdist carry user properties inside the test report to the controlling process, where the
recording plugin turns them into rows. Only plain JSON values cross that boundary.

Invariants:
- ``to_property()`` returns JSON-serialisable dicts with ``kind`` and ``format`` keys; readers refuse a
  ``format`` newer than ``RECORD_FORMAT`` (see ``record_from_property``).
- Records are immutable; a test that measures twice emits two records.
- Status and stage values are the enum values below, never free text.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from grace.pi_contract import PIStage, StageStatus

RECORD_FORMAT = 1
USER_PROPERTY_KEY = "grace_matrix.record"


class RecordFormatError(ValueError):
    """A record property could not be read (unknown kind, newer format, missing field)."""


class CorrectnessStatus(str, enum.Enum):
    """Verdicts of the correctness suite, as PyTorch's dynamo benchmark runner names them."""

    PASS = "pass"
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_TO_RUN = "fail_to_run"
    EAGER_FAIL_TO_RUN = "eager_fail_to_run"
    MODEL_FAIL_TO_LOAD = "model_fail_to_load"
    OOM = "OOM"
    SKIP = "skip"


class PerformanceStatus(str, enum.Enum):
    OK = "ok"
    SKIP = "skip"
    FAIL_TO_RUN = "fail_to_run"
    OOM = "OOM"


@dataclass(frozen=True)
class WorkloadRef:
    """Identity of a workload as stored: its name, tier, tags and a hash of its code."""

    name: str
    tier: str = "smoke"
    tags: tuple[str, ...] = ()
    code_hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tier": self.tier, "tags": list(self.tags), "code_hash": self.code_hash}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadRef:
        return cls(
            name=str(data["name"]),
            tier=str(data.get("tier", "smoke")),
            tags=tuple(data.get("tags", ())),
            code_hash=str(data.get("code_hash", "")),
        )


@dataclass(frozen=True)
class _Record:
    KIND: ClassVar[str] = ""

    def to_property(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, WorkloadRef):
                value = value.to_dict()
            elif isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, tuple):
                value = list(value)
            body[f.name] = value
        return {"kind": self.KIND, "format": RECORD_FORMAT, **body}


@dataclass(frozen=True)
class CorrectnessRecord(_Record):
    """One workload x mode verdict. ``errors`` keeps the figures that led to it (e.g. max_abs, rel_l2,
    cosine); ``tolerance`` the thresholds applied."""

    KIND: ClassVar[str] = "correctness"
    workload: WorkloadRef
    mode: str
    status: CorrectnessStatus
    reason: str | None = None
    errors: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PerformanceRecord(_Record):
    """One workload x mode timing: raw samples in milliseconds and the per-call graph facts."""

    KIND: ClassVar[str] = "performance"
    workload: WorkloadRef
    mode: str
    status: PerformanceStatus
    reason: str | None = None
    samples_ms: tuple[float, ...] = ()
    median_ms: float | None = None
    floor_ms: float | None = None
    compile_s: float | None = None
    peak_mem_bytes: int | None = None
    kernels_in_graphs: int | None = None
    kernel_launches: int | None = None
    graph_launches: int | None = None
    copy_bytes_per_replay: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PIStageRecord(_Record):
    """Outcome of one parameter-indirection stage for one subject (a kernel or a workload)."""

    KIND: ClassVar[str] = "pi_stage"
    subject: str
    stage: PIStage
    status: StageStatus
    message: str = ""
    triton_version: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DiagnosticRecord(_Record):
    """Why (part of) a graph could not be captured: a CGCT reason code, the FX node and the source line."""

    KIND: ClassVar[str] = "diagnostic"
    workload: WorkloadRef
    mode: str
    code: str
    node: str = ""
    source: str = ""
    message: str = ""
    transformed: bool = False
    effect: str = ""  # disables_graphs | splits_graph | rerecords | none


Record = CorrectnessRecord | PerformanceRecord | PIStageRecord | DiagnosticRecord
_KINDS: dict[str, type[_Record]] = {
    cls.KIND: cls for cls in (CorrectnessRecord, PerformanceRecord, PIStageRecord, DiagnosticRecord)
}


def record_from_property(data: Mapping[str, Any]) -> Record:
    """Rebuild a record from ``to_property()`` output; raises RecordFormatError with the reason."""
    kind = data.get("kind")
    if kind not in _KINDS:
        raise RecordFormatError(f"unknown record kind {kind!r}; expected one of {sorted(_KINDS)}")
    fmt = data.get("format")
    if not isinstance(fmt, int) or fmt > RECORD_FORMAT:
        raise RecordFormatError(
            f"record format {fmt!r} is newer than this reader ({RECORD_FORMAT}); upgrade grace-matrix"
        )
    cls = _KINDS[kind]
    kwargs: dict[str, Any] = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in hints.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordFormatError(f"{kind} record lacks required field {name!r}")
            continue
        value = data[name]
        if name == "workload":
            value = WorkloadRef.from_dict(value)
        elif name == "status":
            value = {
                "correctness": CorrectnessStatus,
                "performance": PerformanceStatus,
                "pi_stage": StageStatus,
            }[kind](value)
        elif name == "stage":
            value = PIStage(value)
        elif name == "samples_ms":
            value = tuple(float(v) for v in value)
        kwargs[name] = value
    return cls(**kwargs)  # type: ignore[return-value]
