"""``prepare(ctx)``: turn a captured graph into one that reads its dynamic inputs through a pointer table.

Problem: between capture and instantiation (Note: [PI seam] in grace.capture) PI must find every use
of every dynamic input, redirect the ones it can (Triton kernels rewritten, vendor kernels updated from
the host or on the device) and leave the others reading their placeholders, which the runner keeps
copying into. An input is served by PI only when all of its uses are redirected.

Design: one function per stage, in the order of ``grace.pi_contract.PIStage``, each recording its
outcome in the ``StageLog`` and adding the inputs it could not serve to ``Preparation.uncovered``:
scan the graph (grace.pi.scan); ``locate`` the Triton kernels and split the uses into Triton and
vendor uses; ``build`` the rewritten kernels (rewrite, assemble, load: grace.pi.triton);
``vendor_match`` checks the vendor uses can be prepared; every redirected (input, view offset) pair
gets one slot (``SlotAllocator``); ``patch`` points Triton nodes at the rewritten functions and the
slots; ``vendor_host`` gives each vendor node an argument copy the table's writes update in the executable
graph (grace.pi.vendor_host; option ``pi_vendor_update="host"``), or ``vendor_update`` installs the
device prelude (grace.pi.vendor; ``"device"``); ``table`` chooses the table's writer (a host-to-device
copy, grace.pi.table, or a fill node, grace.pi.fill). The result is a ``grace.pi.plan.PiPlan``.

Invariants:
- Inputs with a use that could not be redirected are ``uncovered``: their slots hold the placeholder's
  address forever, so every node, patched or not, reads the same placeholder the runner copies into.
- A stage that fails for one kernel or node never stops the others; ``prepare`` returns a
  ``SkipReason`` only when no input at all can be served (or PI cannot run here).
- Stage entries are recorded in pipeline order, so the store can show where PI stopped.
"""

from __future__ import annotations

import logging
import struct
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grace.pi import scan as scan_mod
from grace.pi.plan import PiPlan, Slot, StageLog
from grace.pi.scan import InputRange, Use, UseKind
from grace.pi_contract import PIContext, PIStage, StageStatus
from grace.reasons import SkipCode, SkipReason

logger = logging.getLogger(__name__)

VENDOR_ALIGNMENT = 16  # cuBLAS chooses kernels by alignment; TMA descriptors need 16-byte addresses

PASS, FAIL, SKIP = StageStatus.PASS, StageStatus.FAIL, StageStatus.SKIP


@dataclass
class Preparation:
    """What one ``prepare`` call knows about its graph, filled in stage by stage."""

    ctx: PIContext
    device: Any  # torch.device of the graph
    device_index: int
    capability: int
    capturing: bool
    placeholders: dict[int, InputRange]
    stages: StageLog = field(default_factory=StageLog)
    uncovered: dict[int, str] = field(default_factory=dict)

    def uncover(self, uses: list[Use], why: str) -> None:
        for u in uses:
            self.uncovered.setdefault(u.index, why)

    def detail(self) -> str:
        return "; ".join(f"input {i}: {why}" for i, why in sorted(self.uncovered.items()))


@dataclass
class Located:
    """The Triton kernels of the graph and the uses PI redirects, split by path."""

    kernels: dict[int, Any]  # CUfunction -> grace.pi.triton.TritonKernel
    node_function: dict[int, int]  # kernel node -> CUfunction
    triton_uses: dict[int, list[Use]]  # kernel node -> its pointer-parameter uses
    vendor_uses: list[Use]

    def kernel_of(self, node: int) -> Any:
        return self.kernels[self.node_function[node]]


class SlotAllocator:
    """One slot per redirected (input, view offset), with the largest alignment any reader assumes."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, int], int] = {}
        self.alignment: dict[tuple[int, int], int] = defaultdict(lambda: 1)

    def slot_for(self, use: Use, align: int) -> int:
        key = (use.index, use.delta)
        if key not in self.index:
            self.index[key] = len(self.index)
        self.alignment[key] = max(self.alignment[key], align)
        return self.index[key]

    def slots(self) -> list[Slot]:
        ordered = sorted(self.index.items(), key=lambda kv: kv[1])
        return [Slot(i, d, self.alignment[(i, d)]) for (i, d), _ in ordered]


def input_ranges(ctx: PIContext) -> dict[int, InputRange]:
    """Where the graph of ``ctx`` reads each dynamic input: ``ctx.placeholder_spans`` when given (a graph
    rebound by grace.rebind reads its origin's capture addresses), else the placeholders' storages."""
    spans = ctx.placeholder_spans
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


def start(ctx: PIContext) -> Preparation | SkipReason:
    """The graph's device and placeholders, or why PI cannot run on this build or graph."""
    import torch

    from grace.compat import cuda as cuda_compat
    from grace.compat import torch as torch_compat

    if cuda_compat.driver() is None:
        return SkipReason(SkipCode.CUDA_BINDINGS_MISSING, str(cuda_compat.import_error()))
    if not cuda_compat.has_param_info():
        return SkipReason(
            SkipCode.PI_UNAVAILABLE, "cuFuncGetParamInfo needs a CUDA 12.4+ driver and bindings"
        )
    placeholders = input_ranges(ctx)
    if not placeholders:
        return SkipReason(SkipCode.PI_NO_DYNAMIC_INPUTS, "no placeholder was captured")
    # The capture hook runs under the graph device's guard: modules load into that device's context.
    device_index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", device_index)
    major, minor = torch.cuda.get_device_capability(device)
    return Preparation(
        ctx=ctx,
        device=device,
        device_index=device_index,
        capability=10 * major + minor,
        capturing=torch_compat.is_current_stream_capturing(),
        placeholders=placeholders,
    )


def scan(prep: Preparation) -> tuple[list[Any], list[Use]] | SkipReason:
    """Every kernel node and every non-copy use of a placeholder (copy uses are uncovered by the scan)."""
    from grace.pi.plan import graph_nodes_for_scan

    knodes, copies, others = graph_nodes_for_scan(prep.ctx.graph_handle)
    parameterless = [k.node for k in knodes if not k.params and k.extra is None]
    found = scan_mod.scan(knodes, copies, others, list(prep.placeholders.values()), parameterless)
    if found.everything_unaccountable:
        return SkipReason(SkipCode.PI_UNSUPPORTED_NODE, found.everything_unaccountable)
    prep.uncovered.update(found.unaccountable)
    return knodes, [u for u in found.uses if u.kind is not UseKind.COPY]


def locate(prep: Preparation, knodes: list[Any], uses: list[Use]) -> Located:
    """Stage ``locate``: the graph's Triton kernels; pointer parameters of those take the Triton path."""
    from grace.pi import triton as triton_path

    kernels = triton_path.located_kernels(prep.ctx.output_codes)
    node_function = {k.node: k.function for k in knodes}
    triton_uses: dict[int, list[Use]] = defaultdict(list)
    vendor_uses: list[Use] = []
    for use in uses:
        tk = kernels.get(node_function[use.node])
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
    with_ptx = sum(1 for k in kernels.values() if k.ptx)
    prep.stages.add(
        PIStage.LOCATE,
        PASS if kernels else SKIP,
        f"{len(kernels)} Triton kernels located ({with_ptx} with PTX); {len(triton_uses)} Triton nodes and "
        f"{len({u.node for u in vendor_uses})} other nodes read dynamic inputs",
    )
    problems = sorted({k.problem for k in kernels.values() if k.problem})
    if problems:
        prep.stages.add(PIStage.LOCATE, FAIL, f"{len(problems)} kernels cannot be rewritten: {problems[0]}")
    return Located(kernels, node_function, triton_uses, vendor_uses)


def build(prep: Preparation, located: Located) -> dict[int, Any]:
    """Stages ``rewrite``, ``assemble`` and ``load``: the rewritten kernel of every Triton node."""
    from grace.pi import triton as triton_path

    built: dict[int, Any] = {}
    failures: dict[PIStage, list[str]] = defaultdict(list)
    for node, node_uses in located.triton_uses.items():
        tk = located.kernel_of(node)
        indices = sorted({u.param_index for u in node_uses if u.param_index is not None})
        try:
            built[node] = triton_path.build(tk, indices, prep.capability, prep.device_index)
        except triton_path.BuildError as exc:
            failures[exc.stage].append(f"{tk.name}: {exc}")
            prep.uncover(node_uses, f"{exc.stage.value} of {tk.name} failed: {exc}")
    for stage in (PIStage.REWRITE, PIStage.ASSEMBLE, PIStage.LOAD):
        if failures[stage]:
            prep.stages.add(stage, FAIL, f"{len(failures[stage])} failed; first: {failures[stage][0]}")
        elif located.triton_uses:
            kernels = len({b.function for b in built.values()})
            prep.stages.add(stage, PASS, f"{len(built)} nodes ({kernels} kernels)")
        else:
            prep.stages.add(stage, SKIP, "no Triton node reads a dynamic input")
    return built


def vendor_match(prep: Preparation, vendor_uses: list[Use]) -> bool:
    """Stage ``vendor_match``: whether the uses outside rewritable Triton kernels can be prepared."""
    if vendor_uses and prep.capturing:
        why = "the graph is still being captured (torch without keep_graph): vendor nodes cannot be prepared"
        prep.uncover(vendor_uses, why)
        prep.stages.add(PIStage.VENDOR_MATCH, SKIP, why)
        return False
    if vendor_uses:
        nodes = {u.node for u in vendor_uses}
        message = f"{len(vendor_uses)} addresses in {len(nodes)} non-Triton nodes"
        prep.stages.add(PIStage.VENDOR_MATCH, PASS, message)
        return True
    prep.stages.add(PIStage.VENDOR_MATCH, SKIP, "every use is in a rewritable Triton kernel or a copy node")
    return False


def patch(
    prep: Preparation,
    located: Located,
    built: Mapping[int, Any],
    params_of: dict[int, dict[int, int]],
    table: Any,
) -> None:
    """Stage ``patch``: every built Triton node launches its rewritten kernel with slot addresses."""
    from grace.pi import driver

    patched = 0
    for node, params in params_of.items():
        values = {i: struct.pack("<Q", table.address(s)) for i, s in params.items()}
        try:
            driver.patch_kernel_node(node, built[node].function, values)
            patched += 1
        except Exception as exc:
            prep.uncover(located.triton_uses[node], f"patching node {node:#x}: {type(exc).__name__}: {exc}")
    if params_of:
        status = PASS if patched == len(params_of) else FAIL
        message = f"{patched}/{len(params_of)} Triton nodes now read {table.slots} slots"
        prep.stages.add(PIStage.PATCH, status, message)
    else:
        prep.stages.add(PIStage.PATCH, SKIP, "no Triton node to patch")


def vendor_update(
    prep: Preparation, vendor_uses: list[Use], vendor_slots: list[tuple[int, int, int]], table: Any
) -> Any | None:
    """Stage ``vendor_update``: the prelude that writes slot addresses into vendor nodes (or None)."""
    if not vendor_slots:
        why = "vendor uses were not prepared" if vendor_uses else "no vendor node reads a dynamic input"
        prep.stages.add(PIStage.VENDOR_UPDATE, SKIP, why)
        return None
    from grace.pi import vendor

    try:
        setup = vendor.install(
            prep.ctx.graph_handle, vendor_slots, table.address(0), prep.device, prep.capability
        )
    except vendor.VendorError as exc:
        prep.uncover(vendor_uses, f"vendor path: {exc}")
        prep.stages.add(exc.stage, FAIL, str(exc))
        return None
    nodes = len({n for n, _, _ in vendor_slots})
    prep.stages.add(
        PIStage.VENDOR_UPDATE, PASS, f"prelude applies {len(setup.patches)} updates in {nodes} nodes"
    )
    return setup


def vendor_host(
    prep: Preparation, knodes: Sequence[Any], vendor_uses: list[Use], vendor_slots: list[tuple[int, int, int]]
) -> list[Any]:
    """Stage ``vendor_update`` under ``pi_vendor_update="host"``: a private argument copy per vendor node,
    updated in the executable graph when an address changes (grace.pi.vendor_host)."""
    from grace.pi.vendor_host import HostPatch, NodeArguments

    by_node = {k.node: k for k in knodes}
    patches: dict[int, list[HostPatch]] = defaultdict(list)
    for use, (node, offset, slot) in zip(vendor_uses, vendor_slots, strict=True):
        k = by_node[node]
        start = k.params[use.param_index].offset if use.param_index is not None and k.params else 0
        patches[node].append(HostPatch(use.param_index, start, offset, slot))
    nodes = []
    try:
        for node, node_patches in patches.items():
            k = by_node[node]
            params = None if k.extra is not None else [p.raw for p in k.params]
            nodes.append(NodeArguments(node, params, k.extra, node_patches))
    except ValueError as exc:
        prep.uncover(vendor_uses, f"vendor path (host updates): {exc}")
        prep.stages.add(PIStage.VENDOR_UPDATE, FAIL, str(exc))
        return []
    message = f"host updates of {len(vendor_slots)} addresses in {len(nodes)} nodes, when they change"
    prep.stages.add(PIStage.VENDOR_UPDATE, PASS, message)
    return nodes


def table_writer(prep: Preparation, table: Any, slots: list[Slot], placeholder_ptrs: dict[int, int]) -> Any:
    """Stage ``table``: the copy table itself, or a fill node ahead of every root (vendor prelude too).
    Raises ``grace.pi.fill.FillUnsafe`` when a fill node could not be taken out of the graph again."""
    from grace.pi import fill

    return fill.serve(
        prep.ctx.graph_handle,
        table,
        [placeholder_ptrs[s.index] + s.delta for s in slots],
        prep.ctx.pi_table_update,
        capturing=prep.capturing,
        capability=prep.capability,
        device_index=prep.device_index,
        stages=prep.stages,
    )


def prepare(ctx: PIContext) -> PiPlan | SkipReason:
    """The PI seam: a ``PiPlan`` for the graph of ``ctx``, or a ``SkipReason``."""
    from grace.pi import fill
    from grace.pi.table import PointerTable

    prep = start(ctx)
    if isinstance(prep, SkipReason):
        return prep
    scanned = scan(prep)
    if isinstance(scanned, SkipReason):
        return scanned
    located = locate(prep, *scanned)
    built = build(prep, located)
    vendor_ok = vendor_match(prep, located.vendor_uses)
    allocator = SlotAllocator()
    params_of = {
        node: {
            u.param_index: allocator.slot_for(u, located.kernel_of(node).alignment.get(u.param_index, 16))
            for u in node_uses
            if u.param_index is not None
        }
        for node, node_uses in located.triton_uses.items()
        if node in built
    }
    vendor_uses = located.vendor_uses
    vendor_slots = (
        [(u.node, u.byte_offset, allocator.slot_for(u, VENDOR_ALIGNMENT)) for u in vendor_uses]
        if vendor_ok
        else []
    )
    if not allocator.index:
        return SkipReason(SkipCode.PI_NO_KERNELS, prep.detail() or "no node reads a dynamic input")
    table = PointerTable(len(allocator.index), prep.device)
    keep: list[Any] = [table]
    patch(prep, located, built, params_of, table)
    host_nodes: list[Any] = []
    if prep.ctx.pi_vendor_update == "host" and vendor_slots:
        host_nodes = vendor_host(prep, scanned[0], vendor_uses, vendor_slots)
    else:
        setup = vendor_update(prep, vendor_uses, vendor_slots, table)
        if setup is not None:
            keep.append(setup)
    if set(prep.placeholders) <= set(prep.uncovered):
        return SkipReason(SkipCode.PI_FAILED, f"no dynamic input can be served by PI: {prep.detail()}")
    slots = allocator.slots()
    placeholder_ptrs = {i: r.data_ptr for i, r in prep.placeholders.items()}
    try:
        served = table_writer(prep, table, slots, placeholder_ptrs)
    except fill.FillUnsafe as exc:
        return SkipReason(SkipCode.PI_FAILED, f"pointer table fill node: {exc}")
    if host_nodes:
        from grace.pi.vendor_host import HostVendorTable

        served = HostVendorTable(served, host_nodes)
    plan = PiPlan(
        served, slots, placeholder_ptrs, tuple(prep.placeholders), prep.uncovered, prep.stages, keep
    )
    for index, why in sorted(prep.uncovered.items()):
        logger.info("grace PI: input %d keeps its copy: %s", index, why)
    return plan
