"""Diagnostic: a timeline of a training step's shared pool (Note: [A training step in one pool]).

``install()`` wraps, for the rest of the process, the few places where the step's pool changes or says
no: a slot's deciding call (``GraphSlot.decide``, with its nesting depth: a deciding call inside another
one means a set was refused right after its capture), a member joining the pool (with every earlier
member whose outputs its footprint meets, and whether those outputs were held then, kept by autograd,
counted or lent and unbacked), a refused replay (``PoolGroup.overwritten_held_by``, counted per step,
slot and blocking member) and a capture sent to a pool of its own (``poolgroups.for_capture``). Each
event carries ``STEP``, which the caller sets before each training step. ``events()`` returns them
with the refusals folded into counts.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import grace.poolgroups
import grace.slot
from grace.compat import torch as torch_compat

STEP = 0
_events: list[dict[str, Any]] = []
_refusals: Counter[tuple[int, str, str]] = Counter()
_depth = [0]


def _graph_id(kin: object) -> str | None:
    return getattr(kin, "graph_id", None)


def _family_state(seat: Any) -> dict[str, Any]:
    family = seat.graph.family
    return {
        "released": bool(family.released),
        "kept_held": bool(family.kept_held()),
        "counted_held": bool(family.counted_held()),
        "unbacked_held": bool(family.unbacked_held()),
        "lent": bool(family.owners),
    }


def install() -> None:
    group_cls = grace.poolgroups.PoolGroup
    slot_cls = grace.slot.GraphSlot
    join, refused_by, decide = group_cls.join, group_cls.overwritten_held_by, slot_cls.decide
    for_capture = grace.poolgroups.for_capture

    @functools.wraps(decide)
    def traced_decide(self: Any, args: Any, pool_group: Any = None) -> Any:
        _events.append(
            {
                "event": "decide",
                "step": STEP,
                "graph_id": self.record.graph_id,
                "depth": _depth[0],
                "generation": torch_compat.compiled_call_generation(),
                "kept_sets": len(self.kept),
            }
        )
        _depth[0] += 1
        try:
            return decide(self, args, pool_group)
        finally:
            _depth[0] -= 1

    @functools.wraps(join)
    def traced_join(self: Any, graph: Any, **kwargs: Any) -> None:
        join(self, graph, **kwargs)
        seat = self.seat(graph)
        assert seat is not None
        _events.append(
            {
                "event": "join",
                "step": STEP,
                "order": seat.order,
                "graph_id": _graph_id(seat.kin),
                "footprint_known": seat.footprint is not None,
                "meets": [
                    {
                        "order": over.seat.order,
                        "graph_id": _graph_id(over.seat.kin),
                        "storages_met": None if over.part is None else list(over.part.indices),
                        "storages": len(over.seat.storages),
                        **_family_state(over.seat),
                    }
                    for over in seat.overwrites
                ],
            }
        )

    @functools.wraps(refused_by)
    def traced_refused_by(self: Any, graph: Any, generation: int, args: Any) -> str | None:
        blocker = refused_by(self, graph, generation, args)
        if blocker is not None:
            seat = self.seat(graph)
            _refusals[(STEP, str(_graph_id(seat.kin) if seat else None), blocker)] += 1
        return blocker

    @functools.wraps(for_capture)
    def traced_for_capture(group: Any, record: Any) -> Any:
        chosen = for_capture(group, record)
        if group is not None and chosen is None:
            _events.append({"event": "own_pool", "step": STEP, "graph_id": getattr(record, "graph_id", None)})
        return chosen

    group_cls.join = traced_join  # type: ignore[method-assign]
    group_cls.overwritten_held_by = traced_refused_by  # type: ignore[method-assign]
    slot_cls.decide = traced_decide  # type: ignore[method-assign]
    grace.poolgroups.for_capture = traced_for_capture  # type: ignore[assignment]


def events() -> list[dict[str, Any]]:
    """The events so far and the refusals counted per (step, slot, blocking member); then cleared."""
    out = list(_events)
    out += [
        {"event": "refused", "step": step, "graph_id": gid, "blocked_by": blocker, "count": n}
        for (step, gid, blocker), n in sorted(_refusals.items())
    ]
    _events.clear()
    _refusals.clear()
    return out
