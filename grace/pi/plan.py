"""``prepare(ctx)``: turn a captured graph into one that reads its dynamic inputs through a pointer table.

Problem: between capture and instantiation (Note: [PI seam] in grace.capture) PI must find every use
of every dynamic input, redirect the ones it can (Triton kernels rewritten, vendor kernels updated on
the device) and leave the others reading their placeholders, which the runner keeps copying into. An
input is served by PI only when all of its uses are redirected.

Design: scan the graph (grace.pi.scan); build the rewritten Triton kernels the graph needs
(grace.pi.triton); give every redirected (input, view offset) pair one table slot; patch Triton nodes
to the rewritten functions and the slots' addresses; install the vendor prelude for the rest
(grace.pi.vendor). Inputs with a use that could not be redirected are ``uncovered``: their slots hold
the placeholder's address forever, so every node, patched or not, reads the same placeholder the
runner copies into. The table is written per replay by a host-to-device copy (grace.pi.table) or, with
option ``pi_table_update="node"``, by a kernel node at the head of the graph (grace.pi.fill).
``PiPlan.update`` writes this call's addresses into the table; an input whose new
address breaks the alignment a kernel assumed is served by a copy for that call (its slots point at the
placeholder and it is reported in ``uncovered_indices``).

Invariants:
- After ``update`` returned True, every slot holds either the input's ``data_ptr() + offset`` (the
  input is covered this call) or the placeholder's (it is in ``uncovered_indices``).
- ``stages`` lists (stage, status, message) for locate, rewrite, assemble, load, patch, vendor_match,
  vendor_update and table (which path writes the table, and why), so the store can show where PI
  stopped.
"""

from __future__ import annotations

import functools
import logging
import operator
import struct
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from grace.pi import scan as scan_mod
from grace.pi.scan import InputRange, Use, UseKind
from grace.picking import Picker, picker

logger = logging.getLogger(__name__)

VENDOR_ALIGNMENT = 16  # cuBLAS chooses kernels by alignment; TMA descriptors need 16-byte addresses


@dataclass
class StageLog:
    entries: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, stage: str, status: str, message: str) -> None:
        self.entries.append((stage, status, message))


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
    def stages(self) -> list[tuple[str, str, str]]:
        return list(self._stages.entries)

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
                self._stages.add(
                    "table", "fail", f"node: binding the fill node's update: {type(exc).__name__}: {exc}"
                )
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


def _input_ranges(ctx: Any) -> dict[int, InputRange]:
    """Where the graph of ``ctx`` reads each dynamic input: ``ctx.placeholder_spans`` when given (a graph
    rebound by grace.rebind reads its origin's capture addresses), else the placeholders' storages."""
    spans = getattr(ctx, "placeholder_spans", None)
    if spans is not None:
        found = {i: spans[i] for i in ctx.dynamic_input_indices if i in spans}
        return {i: InputRange(i, s.data_ptr, s.start, s.end) for i, s in found.items()}
    ranges = {}
    for index in ctx.dynamic_input_indices:
        t = ctx.placeholders.get(index)
        if t is None:
            continue
        storage = t.untyped_storage()
        start = int(storage.data_ptr())
        ranges[index] = InputRange(index, int(t.data_ptr()), start, start + int(storage.nbytes()))
    return ranges


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
        kind = driver.node_type(node)
        if kind in ("memcpy", "memset"):
            copies.append(scan_mod.CopyNode(node, driver.copy_node_ranges(node, kind)))
        else:
            others[node] = kind
    return knodes, copies, others


def prepare(ctx: Any) -> Any:
    """The PI seam: a ``PiPlan`` for the graph of ``ctx``, or a ``SkipReason``."""
    import torch

    from grace.compat import cuda as cuda_compat
    from grace.compat import torch as torch_compat
    from grace.pi import driver
    from grace.pi import triton as triton_path
    from grace.reasons import SkipCode, SkipReason

    stages = StageLog()
    if cuda_compat.driver() is None:
        return SkipReason(SkipCode.CUDA_BINDINGS_MISSING, str(cuda_compat.import_error()))
    if not cuda_compat.has_param_info():
        return SkipReason(
            SkipCode.PI_UNAVAILABLE, "cuFuncGetParamInfo needs a CUDA 12.4+ driver and bindings"
        )
    placeholders = _input_ranges(ctx)
    if not placeholders:
        return SkipReason(SkipCode.PI_NO_DYNAMIC_INPUTS, "no placeholder was captured")
    capturing = torch_compat.is_current_stream_capturing()
    # The capture hook runs under the graph device's guard: modules load into that device's context.
    device_index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", device_index)
    major, minor = torch.cuda.get_device_capability(device)
    capability = 10 * major + minor

    # Scan every node for uses of the placeholders.
    ranges = list(placeholders.values())
    knodes, copies, others = graph_nodes_for_scan(ctx.graph_handle)
    parameterless = [k.node for k in knodes if not k.params and k.extra is None]
    found = scan_mod.scan(knodes, copies, others, ranges, parameterless)
    if found.everything_unaccountable:
        return SkipReason(SkipCode.PI_UNSUPPORTED_NODE, found.everything_unaccountable)
    uncovered: dict[int, str] = dict(found.unaccountable)
    uses = [u for u in found.uses if u.kind is not UseKind.COPY]

    # Triton kernels: locate, then rewrite / assemble / load per function and parameter set.
    located = triton_path.located_kernels(ctx.output_codes)
    node_by_id = {k.node: k for k in knodes}
    triton_uses: dict[int, list[Use]] = defaultdict(list)
    vendor_uses: list[Use] = []
    for use in uses:
        tk = located.get(node_by_id[use.node].function)
        pmap = tk.param_map if tk is not None else None
        if (
            use.kind is UseKind.PARAM
            and pmap is not None
            and use.param_index is not None
            and pmap.params[use.param_index].role.value == "pointer"
        ):
            triton_uses[use.node].append(use)
        else:
            vendor_uses.append(use)
    with_ptx = sum(1 for k in located.values() if k.ptx)
    stages.add(
        "locate",
        "pass" if located else "skip",
        f"{len(located)} Triton kernels located ({with_ptx} with PTX); {len(triton_uses)} Triton nodes and "
        f"{len({u.node for u in vendor_uses})} other nodes read dynamic inputs",
    )
    problems = sorted({k.problem for k in located.values() if k.problem})
    if problems:
        stages.add("locate", "fail", f"{len(problems)} kernels cannot be rewritten: {problems[0]}")

    built: dict[int, Any] = {}
    failures: dict[str, list[str]] = defaultdict(list)
    for node, node_uses in triton_uses.items():
        tk = located[node_by_id[node].function]
        indices = sorted({u.param_index for u in node_uses if u.param_index is not None})
        try:
            built[node] = triton_path.build(tk, indices, capability, device_index)
        except triton_path.BuildError as exc:
            failures[exc.stage].append(f"{tk.name}: {exc}")
            for u in node_uses:
                uncovered.setdefault(u.index, f"{exc.stage} of {tk.name} failed: {exc}")
    for stage in ("rewrite", "assemble", "load"):
        if failures[stage]:
            stages.add(stage, "fail", f"{len(failures[stage])} failed; first: {failures[stage][0]}")
        elif triton_uses:
            stages.add(
                stage, "pass", f"{len(built)} nodes ({len({b.function for b in built.values()})} kernels)"
            )
        else:
            stages.add(stage, "skip", "no Triton node reads a dynamic input")

    # Vendor matches: every remaining use must be patchable on the device.
    vendor_ok = bool(vendor_uses)
    if vendor_uses and capturing:
        vendor_ok = False
        why = "the graph is still being captured (torch without keep_graph): vendor nodes cannot be prepared"
        for u in vendor_uses:
            uncovered.setdefault(u.index, why)
        stages.add("vendor_match", "skip", why)
    elif vendor_uses:
        nodes = {u.node for u in vendor_uses}
        stages.add("vendor_match", "pass", f"{len(vendor_uses)} addresses in {len(nodes)} non-Triton nodes")
    else:
        stages.add("vendor_match", "skip", "every use is in a rewritable Triton kernel or a copy node")

    # Slots for every redirected use, then the table.
    slot_of: dict[tuple[int, int], int] = {}
    alignment: dict[tuple[int, int], int] = defaultdict(lambda: 1)

    def slot_for(use: Use, align: int) -> int:
        key = (use.index, use.delta)
        if key not in slot_of:
            slot_of[key] = len(slot_of)
        alignment[key] = max(alignment[key], align)
        return slot_of[key]

    triton_patches: dict[int, dict[int, int]] = {}
    for node, node_uses in triton_uses.items():
        if node not in built:
            continue
        tk = located[node_by_id[node].function]
        triton_patches[node] = {
            u.param_index: slot_for(u, tk.alignment.get(u.param_index, 16))
            for u in node_uses
            if u.param_index is not None
        }
    vendor_slots = (
        [(u.node, u.byte_offset, slot_for(u, VENDOR_ALIGNMENT)) for u in vendor_uses] if vendor_ok else []
    )
    if not slot_of:
        detail = "; ".join(f"input {i}: {why}" for i, why in sorted(uncovered.items()))
        return SkipReason(SkipCode.PI_NO_KERNELS, detail or "no node reads a dynamic input")

    from grace.pi.table import PointerTable

    table = PointerTable(len(slot_of), device)
    keep: list[Any] = [table]
    patched = 0
    for node, params in triton_patches.items():
        values = {i: struct.pack("<Q", table.address(s)) for i, s in params.items()}
        try:
            driver.patch_kernel_node(node, built[node].function, values)
            patched += 1
        except Exception as exc:
            for u in triton_uses[node]:
                uncovered.setdefault(u.index, f"patching node {node:#x}: {type(exc).__name__}: {exc}")
    if triton_patches:
        status = "pass" if patched == len(triton_patches) else "fail"
        stages.add(
            "patch", status, f"{patched}/{len(triton_patches)} Triton nodes now read {len(slot_of)} slots"
        )
    else:
        stages.add("patch", "skip", "no Triton node to patch")

    if vendor_slots:
        from grace.pi import vendor

        try:
            setup = vendor.install(ctx.graph_handle, vendor_slots, table.address(0), device, capability)
            keep.append(setup)
            patched_nodes = len({n for n, _, _ in vendor_slots})
            stages.add(
                "vendor_update",
                "pass",
                f"prelude applies {len(setup.patches)} updates in {patched_nodes} nodes",
            )
        except vendor.VendorError as exc:
            for u in vendor_uses:
                uncovered.setdefault(u.index, f"vendor path: {exc}")
            stages.add(exc.stage, "fail", str(exc))
    elif vendor_uses:
        stages.add("vendor_update", "skip", "vendor uses were not prepared")
    else:
        stages.add("vendor_update", "skip", "no vendor node reads a dynamic input")

    if set(placeholders) <= set(uncovered):
        detail = "; ".join(f"input {i}: {why}" for i, why in sorted(uncovered.items()))
        return SkipReason(SkipCode.PI_FAILED, f"no dynamic input can be served by PI: {detail}")
    slots = [Slot(i, d, alignment[(i, d)]) for (i, d), _ in sorted(slot_of.items(), key=lambda kv: kv[1])]
    placeholder_ptrs = {i: r.data_ptr for i, r in placeholders.items()}

    # The table's writer: the copy table itself, or a fill node ahead of every root (vendor prelude too).
    from grace.pi import fill

    try:
        served = fill.serve(
            ctx.graph_handle,
            table,
            [placeholder_ptrs[s.index] + s.delta for s in slots],
            ctx.pi_table_update,
            capturing=capturing,
            capability=capability,
            device_index=device_index,
            stages=stages,
        )
    except fill.FillUnsafe as exc:
        return SkipReason(SkipCode.PI_FAILED, f"pointer table fill node: {exc}")
    plan = PiPlan(
        served,
        slots,
        placeholder_ptrs,
        tuple(placeholders),
        uncovered,
        stages,
        keep,
    )
    for index, why in sorted(uncovered.items()):
        logger.info("grace PI: input %d keeps its copy: %s", index, why)
    return plan
