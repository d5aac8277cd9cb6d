"""The Triton path of parameter indirection: find Inductor's kernels, rewrite, assemble, load, patch.

Problem: a captured kernel node launches a Triton ``CUfunction`` with its arguments baked in. To let a
replay read a moved input, the node must launch a rewritten copy of that kernel whose pointer
parameters are read through slots of the pointer table (grace.pi.ptx), with those parameters set to the
slots' addresses.

Design: ``locate`` maps each ``CUfunction`` of the graph to the ``LocatedKernel`` Inductor holds (its
PTX, signature, specialisation) and derives its ``ParamMap``. ``build`` rewrites the parameters a
graph needs for one function, assembles the result with this Triton's own ptxas and loads it with
``cuModuleLoadData``; results are cached per (function, parameters) for the life of the process, so a
re-capture of the same graph costs nothing and a loaded module is never unloaded while a graph that
may launch it still exists. ``patch`` points the node at the rewritten function and the slots.

Invariants:
- Only parameters the ``ParamMap`` marks as pointers are rewritten; scratch and scalars never.
- ``required_alignment`` is what the kernel was specialised for: 16 for an argument Inductor declared
  16-divisible, and 16 when that cannot be read (the safe side); a new address must meet it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grace.pi import ptx as ptx_rewrite
from grace.pi_contract import PIStage

logger = logging.getLogger(__name__)

ALIGNMENT_UNKNOWN = 16


@dataclass(frozen=True)
class TritonKernel:
    """A Triton kernel of the graph with what PI needs to rewrite it, or why it cannot."""

    function: int
    name: str
    ptx: str | None
    param_map: ptx_rewrite.ParamMap | None
    alignment: dict[int, int]  # PTX parameter index -> alignment the kernel assumes of its value
    num_warps: int
    shared: int
    enable_fp_fusion: bool
    problem: str | None = None  # why this kernel cannot be rewritten


def _divisible_args(triton_meta: Mapping[str, Any], arg_names: Sequence[str]) -> set[str] | None:
    """Arguments specialised 16-divisible, from Inductor's ``configs`` in any Triton's form."""
    configs = triton_meta.get("configs") or ()
    if not configs:
        return None
    config = configs[0]
    indices: Iterable[Any] = ()
    if isinstance(config, Mapping):  # Triton 3.3+: {(index,): [["tt.divisibility", 16]]}
        indices = [
            k[0] for k, attrs in config.items() if any(list(a) == ["tt.divisibility", 16] for a in attrs)
        ]
    elif hasattr(config, "divisible_by_16"):  # 3.0-3.1
        indices = config.divisible_by_16
    elif hasattr(config, "arg_properties"):  # 3.2
        indices = config.arg_properties.get("tt.divisibility", ())
    else:
        return None
    return {arg_names[i] for i in indices if isinstance(i, int) and i < len(arg_names)}


def describe(located: Any, autotuner_meta: Mapping[str, Any] | None = None) -> TritonKernel:
    """Build the ``TritonKernel`` of a ``grace.compat.inductor_kernels.LocatedKernel``."""
    from grace.compat import triton as triton_compat

    base = {
        "function": located.function,
        "name": located.name,
        "ptx": located.ptx,
        "num_warps": located.num_warps,
        "shared": located.shared,
        "enable_fp_fusion": located.enable_fp_fusion,
    }
    if not located.ptx:
        why = "no PTX for this kernel (a static launcher keeps none and the Triton cache has no .ptx file)"
        return TritonKernel(param_map=None, alignment={}, problem=why, **base)
    signature = dict(located.signature)
    if list(signature) != list(located.arg_names):
        why = f"signature {list(signature)} does not list the kernel's arguments {list(located.arg_names)}"
        return TritonKernel(param_map=None, alignment={}, problem=why, **base)
    meta = autotuner_meta or {}
    constants = dict(meta.get("constants", {}) or {})
    specialised = {n for n in constants if signature.get(n) != "constexpr"} | set(located.equal_to_1)
    divisible = _divisible_args(meta, located.arg_names)
    try:
        entry = ptx_rewrite.parse_entry(located.ptx)
        pmap = ptx_rewrite.derive_param_map(
            entry,
            signature,
            specialised=specialised,
            divisible_by_16=divisible or (),
            scratch=triton_compat.scratch_parameters(),
        )
    except ptx_rewrite.PtxRefused as exc:
        return TritonKernel(param_map=None, alignment={}, problem=str(exc), **base)
    alignment = {
        p.index: (16 if divisible is None or p.divisible_by_16 else 1)
        for p in pmap.params
        if p.role is ptx_rewrite.ParamRole.POINTER
    }
    if divisible is None:
        alignment = {i: ALIGNMENT_UNKNOWN for i in alignment}
    return TritonKernel(param_map=pmap, alignment=alignment, **base)


@dataclass(frozen=True)
class BuiltKernel:
    function: int
    module: int
    loads_inserted: dict[int, int]
    ptxas: str


_built: dict[tuple[int, int, str], BuiltKernel] = {}  # (device index, capability, PTX hash)
_built_lock = threading.Lock()


class BuildError(RuntimeError):
    """Rewrite, assembly or loading failed; ``stage`` names which (rewrite, assemble, load)."""

    def __init__(self, stage: PIStage, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def build(
    kernel: TritonKernel, indices: Sequence[int], capability: int, device_index: int = 0
) -> BuiltKernel:
    """The rewritten, assembled and loaded variant of ``kernel`` for parameters ``indices``, loaded into
    the current context, which must be device ``device_index``'s: a loaded module belongs to one
    context, so the cache holds one per device."""
    from grace.compat import triton as triton_compat
    from grace.pi import driver

    if kernel.param_map is None or kernel.ptx is None:
        raise BuildError(PIStage.REWRITE, kernel.problem or "kernel has no parameter map")
    try:
        result = ptx_rewrite.rewrite_pointer_params(kernel.ptx, kernel.param_map, indices)
    except ptx_rewrite.PtxRefused as exc:
        raise BuildError(PIStage.REWRITE, str(exc)) from exc
    key = (device_index, capability, hashlib.sha256(result.ptx.encode()).hexdigest())
    with _built_lock:
        cached = _built.get(key)
        if cached is not None:
            return cached
        ptxas = triton_compat.ptxas_reading(result.ptx, capability)
        try:
            cubin = triton_compat.assemble(
                result.ptx,
                capability=capability,
                num_warps=kernel.num_warps,
                enable_fp_fusion=kernel.enable_fp_fusion,
                ptxas=ptxas,
            )
        except triton_compat.ToolError as exc:
            raise BuildError(PIStage.ASSEMBLE, str(exc).splitlines()[0]) from exc
        try:
            loaded = driver.load_kernel(cubin, kernel.param_map.entry.name, kernel.shared)
        except Exception as exc:
            raise BuildError(PIStage.LOAD, f"{type(exc).__name__}: {exc}") from exc
        built = BuiltKernel(
            function=loaded.function,
            module=loaded.module,
            loads_inserted=dict(result.loads_inserted),
            ptxas=ptxas.release,
        )
        _built[key] = built
        return built


def located_kernels(output_codes: Sequence[Any]) -> dict[int, TritonKernel]:
    """Every Triton kernel of the Inductor modules behind ``output_codes``, by ``CUfunction``."""
    from grace.compat import inductor_kernels
    from grace.compat import torch as torch_compat

    found: dict[int, TritonKernel] = {}
    for code in output_codes:
        module_globals = torch_compat.inductor_module_globals(code)
        if not module_globals:
            continue
        metas = {
            name: getattr(value, "triton_meta", {}) or {}
            for name, value in module_globals.items()
            if type(value).__name__ == "CachingAutotuner"
        }
        for located in inductor_kernels.locate_inductor_kernels(module_globals):
            if located.function:
                found[located.function] = describe(located, metas.get(located.autotuner))
    return found
