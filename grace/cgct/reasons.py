"""Why a graph cannot be captured whole: reason codes, their effect, and the Diagnosis record.

Problem: Inductor explains a refused CUDA graph in one log line (``skipping cudagraphs due to ...``)
and counts it in ``counters["inductor"]["cudagraph_skips"]``; with graph partitions (2.9+) it splits
silently. Users, the suites and the matrix need the reason as data: a stable code, the FX node, the
user's source line, and whether CGCT fixed it.

Design: ``ReasonCode`` values are the stored strings (never rename a value; add new ones).
``Effect`` says what the reason does on the running torch and configuration, so one code can mean
"disables graphs" on 2.4 and "splits the graph" on 2.11. ``Diagnosis`` is frozen and carries only
plain data, so it can be logged, compared and turned into a suites record.

Invariant: a Diagnosis with ``transformed=True`` describes something CGCT removed from the graph it
returned; with ``transformed=False`` the cause is still there.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import torch.fx


class ReasonCode(str, enum.Enum):
    CPU_DEVICE = "cpu_device"
    """A node computes on the CPU (a CPU tensor, factory, input or module attribute)."""
    PARTITION_SPLIT_CPU_OP = "partition_split_cpu_op"
    """Same cause as CPU_DEVICE where graph partitions split around it instead of disabling graphs."""
    DEVICE_COPY = "device_copy"
    """A host/device copy inside the graph (a partition boundary; a CPU node without partitions)."""
    MULTIPLE_DEVICES = "multiple_devices"
    MUTATED_INPUTS = "mutated_inputs"
    INCOMPATIBLE_OP = "incompatible_op"
    COMPLEX_MEMORY_OVERLAP = "complex_memory_overlap"
    NON_TENSOR_INPUTS = "non_tensor_inputs"
    DYNAMIC_SHAPES = "dynamic_shapes"
    CONTROL_FLOW = "control_flow"
    DATA_DEPENDENT_SYNC = "data_dependent_sync"
    """``.item()``, ``.tolist()``, ``nonzero`` and friends: the host waits for a device value."""
    CPU_ATTRIBUTE = "cpu_attribute"
    """A module attribute (parameter, buffer, plain tensor, list of tensors) kept on the CPU."""
    CACHING_ALLOCATOR_DISABLED = "caching_allocator_disabled"
    NO_CUDA_WORK = "no_cuda_work"
    """The graph has no CUDA tensor at all: nothing to capture."""
    ANALYSIS_INCOMPLETE = "analysis_incomplete"
    """CGCT could not run a node on fake tensors and relied on recorded metadata for it."""
    TRANSFORM_REJECTED = "transform_rejected"
    """CGCT's own check found the rewritten graph different from the original; it kept the original."""


class Effect(str, enum.Enum):
    DISABLES_GRAPHS = "disables_graphs"
    SPLITS_GRAPH = "splits_graph"
    RERECORDS = "rerecords"
    """Captured, but once per distinct input shape."""
    NONE = "none"


@dataclass(frozen=True)
class Diagnosis:
    """One reason, tied to one FX node and the user's source line that produced it."""

    code: ReasonCode
    node: str
    source: str
    message: str
    transformed: bool = False
    effect: Effect = Effect.NONE

    def describe(self) -> str:
        status = "fixed by CGCT" if self.transformed else self.effect.value.replace("_", " ")
        where = f" at {self.source}" if self.source else ""
        return f"[{self.code.value}] {self.node}{where}: {self.message} ({status})"


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def source_of(node: torch.fx.Node) -> str:
    """``file:line`` of the innermost user frame in the node's recorded stack trace.

    A placeholder has no trace of its own; like Inductor, use the first user's trace.
    """
    candidates = [node]
    if node.op in ("placeholder", "get_attr"):
        candidates = list(node.users)
    for candidate in candidates:
        trace = candidate.meta.get("stack_trace")
        if not trace:
            continue
        frames = _FRAME.findall(trace)
        if frames:
            path, line = frames[-1]
            return f"{path}:{line}"
    return ""


def node_label(node: torch.fx.Node) -> str:
    """``name (target)`` for a diagnosis: the FX name and what it calls."""
    if node.op in ("placeholder", "output"):
        return node.name
    target = node.target
    label = target if isinstance(target, str) else getattr(target, "__name__", None) or str(target)
    return f"{node.name} ({label})"
