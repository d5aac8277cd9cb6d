"""The contract between the graph runtime and parameter indirection (PI): its context, plan and stages.

Problem: the runtime (grace.capture, grace.decide, grace.verify) hands a captured graph to PI and then
drives the plan PI returns on every replay, while PI itself (grace.pi) may be missing or fail to import
on a given build. Both sides must agree on every member the runtime uses, and the store, the suites and
the dashboards must name PI's stages with the same words PI records.

Design: this module imports nothing but the standard library (the suites and the dashboards read
``PIStage`` and ``StageStatus`` without torch). ``PIContext`` is what ``prepare`` reads of a capture
(``grace.capture.CaptureContext`` satisfies it); ``PIPlan`` declares every member the runtime calls on a
plan, so that no caller probes a plan with ``getattr``; ``PlanDefaults`` gives a plan that needs no
launch preparation, no health check, no release and cannot rebase the members' neutral behaviour.
``PIPrepare`` is the seam's signature: a plan, or a ``SkipReason`` saying why PI declined the graph.

Invariants:
- ``PIStage`` is the one stage vocabulary: PI records ``(stage.value, status.value, message)`` in
  ``PIPlan.stages``, in pipeline order of the members below; ``suites.records`` reuses these enums.
- ``update`` returning True means every index outside ``uncovered_indices`` is served by the table this
  call; False means every slot points at its placeholder and the runner copies every dynamic input.
- ``prepare_launch`` is called once, after instantiation and before the first replay, exactly when
  ``launch_preparation_needed`` is True; ``health`` may synchronise and is called only after a replay.
- ``release`` never needs to be called twice and must not raise for a plan whose graph is gone.

Importing this module never imports grace.pi, torch, Triton or cuda-bindings.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from grace.reasons import SkipReason

StageEntry = tuple[str, str, str]
"""(stage, status, message): one ``PIStage`` value, one ``StageStatus`` value and a free-text detail."""


class PIStage(str, enum.Enum):
    """Stages of parameter indirection, in pipeline order (DESIGN 3.3, 3.4)."""

    LOCATE = "locate"
    REWRITE = "rewrite"
    ASSEMBLE = "assemble"
    LOAD = "load"
    PATCH = "patch"
    NUMERIC = "numeric"
    VENDOR_MATCH = "vendor_match"
    VENDOR_UPDATE = "vendor_update"
    TABLE = "table"


class StageStatus(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class StageSink(Protocol):
    """Where a PI step records its stage outcome (``grace.pi.plan.StageLog``)."""

    def add(self, stage: PIStage, status: StageStatus, message: str) -> None: ...


class PIContext(Protocol):
    """What ``prepare`` reads of a graph between capture and instantiation (``CaptureContext``)."""

    @property
    def graph_handle(self) -> int: ...

    @property
    def placeholders(self) -> Mapping[int, Any]: ...

    @property
    def dynamic_input_indices(self) -> tuple[int, ...]: ...

    @property
    def output_codes(self) -> tuple[Any, ...]: ...

    @property
    def device(self) -> Any: ...

    @property
    def pi_table_update(self) -> str: ...

    @property
    def pi_vendor_update(self) -> str: ...

    @property
    def placeholder_spans(self) -> Mapping[int, Any] | None: ...


@runtime_checkable
class PIPlan(Protocol):
    """A prepared parameter indirection for one graph (see Note: [PI seam] in grace.capture)."""

    @property
    def uncovered_indices(self) -> tuple[int, ...]:
        """Dynamic inputs the runner still copies into their placeholders (after the last ``update``)."""
        ...

    @property
    def uncovered_reasons(self) -> Mapping[int, str]:
        """Why each statically uncovered input keeps its copy."""
        ...

    @property
    def bytes_per_replay(self) -> int: ...

    @property
    def stages(self) -> list[StageEntry]: ...

    @property
    def launch_preparation_needed(self) -> bool: ...

    def update(self, inputs: Sequence[Any]) -> bool: ...

    def rebase_placeholders(self, addresses: dict[int, int]) -> None: ...

    def prepare_launch(self, graph_exec: int | None, stream: int) -> None: ...

    def health(self) -> str | None: ...

    def release(self) -> None: ...


class PlanDefaults:
    """The neutral members of a ``PIPlan``: subclass and provide ``uncovered_indices``,
    ``bytes_per_replay``, ``stages`` and ``update``."""

    uncovered_reasons: Mapping[int, str] = MappingProxyType({})
    launch_preparation_needed: bool = False

    def rebase_placeholders(self, addresses: dict[int, int]) -> None:
        raise RuntimeError("a graph captured on the caller's inputs needs a plan that can rebase")

    def prepare_launch(self, graph_exec: int | None, stream: int) -> None:
        return None

    def health(self) -> str | None:
        return None

    def release(self) -> None:
        return None


PIPrepare = Callable[[Any], "PIPlan | SkipReason"]
"""The PI seam: ``grace.pi.prepare(ctx)`` with a ``PIContext``."""
