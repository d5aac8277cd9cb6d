"""What the store says about a training workload: that it is one, its inference twin, its phases.

Problem: the report and the dashboards show a training workload beside the inference workload of the
same model. The store keeps of a workload only its name, tier, tags and code hash (``Workload``): no
link from ``DistilGPT2_train`` to ``DistilGPT2``. A performance record of a training iteration carries
its kernel facts per phase (``details.phases``, written by suites.performance), which no column holds.

Design: three readings, each in one place. A workload is training when its stored tags hold
``TRAINING_TAG`` (the suites' ``Tag.TRAINING``, stored with every record's ``WorkloadRef``): one rule for
every reader, checked against the suites' enum by the tests (this package must not import the
registry, which imports torch). The twin comes from the suites' naming rule (``inference_twin``); the
phases from the record's details (``phases_of``), in the order the suites declare them (``PHASES``).

Invariants: no torch import; a phase or a figure the record does not hold is absent (None), never 0;
a name outside the naming rule has no twin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from matrix.unreadable import Unreadable

TRAINING_TAG = "training"  # suites.workloads.registry.Tag.TRAINING (tests/test_training_report.py checks)
PHASES = ("forward", "backward", "optimizer")  # suites.training.PHASES without their "train." prefix
_TRAINING_NAME = re.compile(r"(?P<model>.+?)_train(?:_(?P<variant>[A-Za-z0-9]+))?")


@dataclass(frozen=True)
class PhaseFacts:
    """One phase of a training iteration as the profile of one call counted it (suites.launches)."""

    phase: str
    kernels_in_graphs: int | None
    kernel_launches: int | None
    graph_launches: int | None


def is_training(tags: Iterable[Any] | Unreadable | None) -> bool:
    """Whether a workload's stored tags say that one call is a training iteration (unreadable tags say
    nothing)."""
    return not isinstance(tags, Unreadable) and TRAINING_TAG in (tags or ())


def inference_twin(name: str) -> str | None:
    """The name of the inference workload whose model a training workload trains, by the suites'
    naming rule (suites.workloads.training): ``<model>_train``, or ``<model>_train_<variant>`` for a
    variant of the same step (``DistilGPT2_train_amp``: bfloat16 autocast), is the training workload of
    inference workload ``<model>``. None for a name outside the rule. Whether that workload exists (in a
    cell) is for the caller to find out: ``BertForMaskedLM_train`` has no inference workload."""
    match = _TRAINING_NAME.fullmatch(name)
    return match.group("model") if match else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def phases_of(details: Mapping[str, Any] | None) -> tuple[PhaseFacts, ...]:
    """The phases a performance record's details hold, in ``PHASES`` order (others after, by name);
    () when the record has none (not a training iteration, or its profile failed)."""
    phases = details.get("phases") if isinstance(details, Mapping) else None
    if not isinstance(phases, Mapping):
        return ()
    order = {name: i for i, name in enumerate(PHASES)}
    facts = []
    for name in sorted(phases, key=lambda n: (order.get(n, len(order)), n)):
        entry = phases[name]
        if not isinstance(entry, Mapping):
            continue
        facts.append(
            PhaseFacts(
                phase=str(name),
                kernels_in_graphs=_count(entry.get("kernels_in_graphs")),
                kernel_launches=_count(entry.get("kernel_launches")),
                graph_launches=_count(entry.get("graph_launches")),
            )
        )
    return tuple(facts)
