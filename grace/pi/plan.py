"""``PiPlan``: a prepared graph's pointer table and the rules for filling it on every replay.

Problem: a graph prepared for parameter indirection (grace.pi.stages) reads each covered dynamic input
through one or more 8-byte table slots (one per view offset a kernel was given). Before each replay the
runner hands the plan this call's inputs; the plan must write every slot in one table write, on the hot
path, and fall back to the placeholder for an input whose address breaks the alignment a kernel assumed.

Design: ``PiPlan`` satisfies ``grace.pi_contract.PIPlan``. ``_CallPlan`` works out once what ``update``
needs per call (which inputs it reads, how slot values follow from their addresses, one bit mask for
the common alignment rule), so a call costs a pick, an OR and one table write. The table is written by
a host-to-device copy (grace.pi.table) or a fill node at the head of the graph (grace.pi.fill).
``StageLog`` records the stages' outcomes as ``grace.pi_contract`` values. ``graph_nodes_for_scan``
reads a graph's nodes as ``grace.pi.scan`` expects them (also used by grace.rebind).

Invariants:
- After ``update`` returned True, every slot holds either the input's ``data_ptr() + offset`` (the
  input is covered this call) or the placeholder's (it is in ``uncovered_indices``).
- After ``update`` returned False, every slot holds its placeholder's address and every dynamic input
  is reported uncovered.
- ``stages`` lists (stage, status, message) entries in the order of ``PIStage``, so the store can show
  where PI stopped.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from grace.pi import scan as scan_mod
from grace.pi_contract import PIStage, StageEntry, StageStatus
from grace.picking import Picker, picker

logger = logging.getLogger(__name__)


@dataclass
class StageLog:
    """The (stage, status, message) entries of one preparation, in the order they were recorded."""

    entries: list[StageEntry] = field(default_factory=list)

    def add(self, stage: PIStage, status: StageStatus, message: str) -> None:
        self.entries.append((PIStage(stage).value, StageStatus(status).value, message))


@dataclass(frozen=True)
class Slot:
    index: int  # the dynamic input
    delta: int  # byte offset of the view the kernel was given
    alignment: int  # the alignment every reader of this slot assumes


class PiPlan:
    """A prepared graph's pointer table and the rules for filling it (satisfies ``PIPlan``)."""

    def __init__(
        self,
        table: Any,
        slots: Sequence[Slot],
        placeholder_ptrs: dict[int, int],
        dynamic_indices: Sequence[int],
        uncovered: dict[int, str],
        stages: StageLog,
        keep_alive: Sequence[Any] = (),
    ) -> None:
        self._table = table
        self._slots = tuple(slots)
        self._placeholders = dict(placeholder_ptrs)
        self._dynamic = tuple(dynamic_indices)
        self.uncovered_reasons = dict(uncovered)
        self._static_uncovered = frozenset(uncovered)
        self._static_sorted = tuple(sorted(self._static_uncovered))
        self._uncovered = self._static_sorted
        self._stages = stages
        self._keep_alive = list(keep_alive)
        self.alignment_fallbacks = 0
        self._slots_of: dict[int, list[Slot]] = defaultdict(list)
        for slot in self._slots:
            self._slots_of[slot.index].append(slot)
        self._calls = _CallPlan.of(self._slots, self._placeholders, self._dynamic, self._static_uncovered)

    @property
    def uncovered_indices(self) -> tuple[int, ...]:
        return self._uncovered

    @property
    def bytes_per_replay(self) -> int:
        return int(self._table.bytes_per_copy)

    @property
    def stages(self) -> list[StageEntry]:
        return list(self._stages.entries)

    @property
    def launch_preparation_needed(self) -> bool:
        """Always: ``prepare_launch`` decides itself whether a fill node or vendor nodes need it."""
        return True

    @property
    def slot_count(self) -> int:
        return len(self._slots)

    def update(self, inputs: Sequence[Any]) -> bool:
        calls = self._calls
        bases = device_addresses(calls.served(inputs))
        if None in bases:
            return self._all_placeholders()
        addresses = cast(list[int], bases)
        if not calls.surely_aligned(addresses):
            return self._update_with_fallbacks(addresses)
        self._table.write(calls.values(addresses))
        self._uncovered = self._static_sorted
        return True

    def _update_with_fallbacks(self, bases: list[int]) -> bool:
        """This call's table when some inputs break their slots' alignment: those read placeholders."""
        calls = self._calls
        uncovered = set(self._static_uncovered)
        addresses: dict[int, int] = {}
        for index, base in zip(calls.served_indices, bases, strict=True):
            addresses[index] = base
            if any((base + s.delta) % s.alignment for s in self._slots_of[index]):
                uncovered.add(index)
                self.alignment_fallbacks += 1
        values = [
            (self._placeholders[s.index] if s.index in uncovered else addresses[s.index]) + s.delta
            for s in self._slots
        ]
        self._table.write(values)
        self._uncovered = tuple(sorted(uncovered))
        return True

    def rebase_placeholders(self, addresses: dict[int, int]) -> None:
        """The placeholders now sit at ``addresses`` (a graph captured on the caller's inputs got its own:
        ``CapturedGraph.own_placeholders``); slots that read a placeholder point there from now on."""
        self._placeholders.update(addresses)
        self._calls = _CallPlan.of(self._slots, self._placeholders, self._dynamic, self._static_uncovered)

    def _all_placeholders(self) -> bool:
        self._table.write([self._placeholders[s.index] + s.delta for s in self._slots])
        self._uncovered = tuple(sorted(self._dynamic))
        return False

    @property
    def vendor_setups(self) -> list[Any]:
        """The vendor preludes of this graph (objects with a ``status`` tensor, see grace.pi.vendor)."""
        return [k for k in self._keep_alive if hasattr(k, "prelude_node") and hasattr(k, "status")]

    def prepare_launch(self, graph_exec: int | None, stream: int) -> None:
        """Called once after instantiation, before the first replay: bind the table's fill node to the
        executable graph, and upload a graph with vendor nodes.

        A table served by a fill node (grace.pi.fill) is updated through the executable graph; CUDA asks
        for ``cuGraphUpload`` before launching a graph whose kernel nodes are updated on the device
        (DESIGN 3.4). A graph with neither needs nothing. Raises when a step is needed and cannot be
        done, so that the caller declines PI for this graph (a fill node that cannot be updated would
        make every replay read the placeholders' addresses).
        """
        prepare_table = getattr(self._table, "prepare_launch", None)
        if callable(prepare_table):
            try:
                prepare_table(graph_exec, stream)
            except Exception as exc:
                message = f"binding the table's update to the executable graph: {type(exc).__name__}: {exc}"
                self._stages.add(PIStage.TABLE, StageStatus.FAIL, message)
                raise
        if not self.vendor_setups:
            return
        if graph_exec is None:
            raise RuntimeError("the graph has vendor nodes but this torch gives no executable graph handle")
        from grace.pi import driver

        driver.graph_upload(graph_exec, stream)

    def health(self) -> str | None:
        """None when the last replay's vendor preludes all applied their updates, else what failed.

        Reads device memory (a synchronisation): call it where a replay has completed, not per replay.
        A prelude that never ran (status -1) is only a problem after a replay, which the caller knows.
        """
        from grace.pi import vendor

        for setup in self.vendor_setups:
            status = vendor.prelude_status(setup)
            if status != 0:
                return f"vendor prelude status {status} (cudaGraphKernelNodeUpdatesApply did not succeed)"
        return None

    def release(self) -> None:
        """Drop the table and vendor buffers (rewritten modules stay cached for other graphs)."""
        self._keep_alive.clear()


def device_addresses(values: Sequence[Any]) -> list[int | None]:
    """``data_ptr()`` of each CUDA tensor; None for anything else (the plan then copies every input)."""
    try:
        return [v.data_ptr() if v.is_cuda else None for v in values]  # tensors: the common case, fast
    except AttributeError:
        import torch

        return [int(v.data_ptr()) if isinstance(v, torch.Tensor) and v.is_cuda else None for v in values]


@dataclass(frozen=True)
class _CallPlan:
    """What ``PiPlan.update`` needs per call, worked out once: which inputs it reads, how the slot
    values follow from their addresses, and one bit mask that tells whether they are all aligned.

    ``served_indices`` are the dynamic inputs with a slot that is not statically uncovered, in order;
    ``sources`` gives per slot (position in ``served_indices`` or -1, addend): the value is
    ``address[position] + addend``, or the addend alone (a placeholder's address plus offset) for -1.
    ``identity`` says the values are the addresses themselves. ``align_mask`` is set when every slot's
    rule is "address divisible by a power of two": when the OR of all addresses has none of the low bits
    of the largest such alignment set, every input is aligned (otherwise the caller checks each rule).
    Alignment 1 is no rule at all."""

    served_indices: tuple[int, ...]
    served: Picker
    sources: tuple[tuple[int, int], ...]
    identity: bool
    align_mask: int | None
    requirements: tuple[tuple[tuple[int, int], ...], ...]  # per served input: (alignment, residue)

    @classmethod
    def of(
        cls,
        slots: Sequence[Slot],
        placeholders: dict[int, int],
        dynamic: Sequence[int],
        static_uncovered: frozenset[int],
    ) -> _CallPlan:
        with_slots = {s.index for s in slots}
        served = tuple(i for i in dynamic if i in with_slots and i not in static_uncovered)
        position = {index: k for k, index in enumerate(served)}
        sources = tuple(
            (position[s.index], s.delta) if s.index in position else (-1, placeholders[s.index] + s.delta)
            for s in slots
        )
        identity = sources == tuple((k, 0) for k in range(len(served)))
        requirements = tuple(
            tuple(
                sorted(
                    {
                        (s.alignment, -s.delta % s.alignment)
                        for s in slots
                        if s.index == index and s.alignment > 1
                    }
                )
            )
            for index in served
        )
        rules = {rule for per_input in requirements for rule in per_input}
        mask = None
        if all(r == 0 and a & (a - 1) == 0 for a, r in rules):
            mask = max((a for a, _ in rules), default=1) - 1
        return cls(served, picker(served), sources, identity, mask, requirements)

    def surely_aligned(self, addresses: list[int]) -> bool:
        """True when every address meets its slots' alignment; False may be a false alarm of the mask."""
        if self.align_mask is not None:
            return not (functools.reduce(operator.or_, addresses, 0) & self.align_mask)
        return all(
            base % alignment == residue
            for base, rules in zip(addresses, self.requirements, strict=True)
            for alignment, residue in rules
        )

    def values(self, addresses: list[int]) -> list[int]:
        if self.identity:
            return addresses
        return [(addresses[k] if k >= 0 else 0) + addend for k, addend in self.sources]


def graph_nodes_for_scan(graph: int) -> tuple[list[Any], list[scan_mod.CopyNode], dict[int, str]]:
    """The nodes of ``graph`` as ``scan_mod.scan`` reads them: kernel nodes (``grace.cudagraph``), memcpy
    and memset nodes with the ranges they touch, and the type of every other node."""
    from grace import cudagraph
    from grace.compat import cuda as cuda_compat
    from grace.pi import driver

    knodes = cudagraph.kernel_nodes(graph)
    kernel_ids = {k.node for k in knodes}
    copies, others = [], {}
    for node in cuda_compat.graph_nodes(graph):
        if node in kernel_ids:
            continue
        kind = cuda_compat.node_type(node)
        if kind in ("memcpy", "memset"):
            copies.append(scan_mod.CopyNode(node, driver.copy_node_ranges(node, kind)))
        else:
            others[node] = kind
    return knodes, copies, others
