"""Random call schedules for a generated model: how, in what order and with what inputs it is called.

Problem: the bugs the fuzzer hunts live in the calls, not the model: inputs that move to new addresses
between calls (fresh tensors, views at offsets into a larger buffer), outputs the caller keeps and reads
later, shape changes past ``max_graphs_per_callable``, inputs the model mutates, two threads calling at
once, a side stream still reading the outputs of one call while the next runs on another stream,
``torch.manual_seed`` before calls of a model with random ops, and user writes to module attributes
through ``.data``.

Design: ``generate_schedule(rng, model, ...)`` draws a ``Schedule``: a grad mode and a list of
``Step``s, each a kind (``StepKind``) and its calls (``CallSpec``: the row count, where each input comes
from, the data seed, the manual seed, whether the outputs are held). A schedule is plain data: it
round-trips through JSON (``to_dict``/``from_dict``) and is what a failure prints and records.

Invariants: steps only use what the case allows: concurrent calls only for pure models (no state, no
random ops) and only when held outputs are promised (``clone_outputs``), since without it a call may
overwrite the other thread's outputs by contract; stream steps only on CUDA; every call of a model with
random ops is seeded (otherwise eager and grace draw different numbers by design).
"""

from __future__ import annotations

import enum
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from suites.fuzz.models import ROW_CHOICES, ModelSpec


class StepKind(str, enum.Enum):
    CALL = "call"  # one call on the current stream
    CONCURRENT = "concurrent"  # two calls started together from two threads
    STREAM = "stream"  # call; a side stream reads its outputs late; the next call runs on another stream
    WRITE_ATTRIBUTE = "write_attribute"  # the user scales a buffer or CPU attribute through ``.data``
    RELEASE = "release"  # the caller drops every output it holds


class Placement(str, enum.Enum):
    FRESH = "fresh"  # a new tensor (a new address)
    VIEW = "view"  # a view at an offset into a larger new buffer (new address, other strides)
    REUSE = "reuse"  # the same tensor object as the previous call (mutations carry over)


class GradMode(str, enum.Enum):
    NO_GRAD = "no_grad"
    INFERENCE = "inference_mode"
    GRAD = "grad"  # autograd on: parameters require grad, nothing calls backward


@dataclass(frozen=True)
class CallSpec:
    rows: int
    placements: tuple[str, ...]  # per tensor input, a Placement value
    data_seed: int
    # per tensor input of a VIEW: (row offset, column offset, extra columns of the buffer); with no extra
    # columns the view has the strides of a fresh tensor (it differs in address only)
    offsets: tuple[tuple[int, int, int], ...] = ()
    manual_seed: int | None = None
    hold: bool = False


@dataclass(frozen=True)
class Step:
    kind: str  # a StepKind value
    calls: tuple[CallSpec, ...] = ()
    attribute: str | None = None
    factor: float = 1.0


@dataclass(frozen=True)
class Schedule:
    grad_mode: str
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def calls(self) -> int:
        return sum(len(step.calls) for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        steps = []
        for step in data["steps"]:
            calls = tuple(
                CallSpec(
                    rows=c["rows"],
                    placements=tuple(c["placements"]),
                    data_seed=c["data_seed"],
                    offsets=tuple(tuple(o) for o in c.get("offsets", ())),  # type: ignore[misc]
                    manual_seed=c.get("manual_seed"),
                    hold=c.get("hold", False),
                )
                for c in step.get("calls", ())
            )
            steps.append(Step(step["kind"], calls, step.get("attribute"), step.get("factor", 1.0)))
        return cls(data["grad_mode"], tuple(steps))


def _call(
    rng: random.Random,
    model: ModelSpec,
    rows: int,
    previous: CallSpec | None,
    hold_probability: float,
    pads: tuple[int, ...],
) -> CallSpec:
    placements, offsets = [], []
    for pad in pads:
        choices = [Placement.FRESH, Placement.VIEW]
        if previous is not None and previous.rows == rows:
            choices.append(Placement.REUSE)
        placement = rng.choices(choices, [5, 3, 2][: len(choices)])[0]
        placements.append(placement.value)
        view = placement is Placement.VIEW
        offsets.append((rng.randint(0, 3), rng.randint(0, pad), pad) if view else (0, 0, 0))
    return CallSpec(
        rows=rows,
        placements=tuple(placements),
        data_seed=rng.randrange(2**31),
        offsets=tuple(offsets),
        manual_seed=rng.randrange(2**31) if model.random_ops else None,
        hold=rng.random() < hold_probability,
    )


def generate_schedule(
    rng: random.Random,
    model: ModelSpec,
    *,
    max_calls: int,
    max_held: int,
    clone_outputs: bool,
    cuda: bool,
    graph_bound: int | None = None,
) -> Schedule:
    """Draw a schedule for ``model`` (module docstring). ``clone_outputs``: whether the options under
    test promise held outputs; ``cuda``: whether stream steps can run; ``graph_bound``: the options'
    ``max_graphs_per_callable`` when it is small enough for the row counts to pass it."""
    grad_mode = rng.choices(list(GradMode), [4, 4, 2])[0].value
    rows_pool = [rng.choice(ROW_CHOICES)]
    bounded = graph_bound is not None and graph_bound < len(ROW_CHOICES)
    if rng.random() < (0.8 if bounded else 0.35):  # shape changes: up to every row count
        fewest = min(len(ROW_CHOICES), graph_bound + 2) if bounded and graph_bound else 2
        rows_pool = rng.sample(ROW_CHOICES, rng.randint(fewest, len(ROW_CHOICES)))
    # Per input, the extra columns of the buffers its views live in: fixed for the case, so views have
    # one stride pattern (each new pattern is a recompile, which costs seconds and tests nothing new).
    pads = tuple(rng.choice((0, 0, 0, 3)) for _, cols in model.inputs if cols is not None)
    attributes = [f"buf{i}" for i in range(len(model.buffers))]
    attributes += [f"cpu{i}" for i in range(len(model.cpu_attributes))]
    steps: list[Step] = []
    calls, held = 0, 0
    previous: CallSpec | None = None
    target = rng.randint(4, max_calls)
    while calls < target:
        roll = rng.random()
        if held >= max_held or (held and roll < 0.08):
            steps.append(Step(StepKind.RELEASE.value))
            held = 0
            continue
        if attributes and roll < 0.15:
            steps.append(
                Step(
                    StepKind.WRITE_ATTRIBUTE.value,
                    attribute=rng.choice(attributes),
                    factor=rng.choice((0.5, 2.0)),
                )
            )
        rows = rng.choice(rows_pool)
        if model.pure and clone_outputs and calls and roll > 0.85 and calls + 2 <= max_calls:
            pair = (_call(rng, model, rows, None, 0.5, pads), _call(rng, model, rows, None, 0.5, pads))
            steps.append(Step(StepKind.CONCURRENT.value, pair))
        elif cuda and 0.7 < roll <= 0.85 and calls + 2 <= max_calls:
            first = _call(rng, model, rows, previous, 1.0, pads)
            second = _call(rng, model, rng.choice(rows_pool), None, 0.3, pads)
            steps.append(Step(StepKind.STREAM.value, (first, second)))
        else:
            steps.append(Step(StepKind.CALL.value, (_call(rng, model, rows, previous, 0.4, pads),)))
        last = steps[-1]
        calls += len(last.calls)
        held += sum(c.hold for c in last.calls)
        previous = last.calls[-1] if last.kind == StepKind.CALL.value else None
    return Schedule(grad_mode, tuple(steps))
