"""torch differences between 2.4 and 2.15, exposed as capabilities.

Problem: grace drives private parts of torch (Dynamo's backend registry, Inductor's ``compile_fx``, the
CUDA graph object) whose names and signatures move between releases. Other grace modules must not know
which release they run on.

Design: each capability is probed once (attribute or signature present), never inferred from a version
number, and every helper keeps one signature whatever the release. Facts relied on (DESIGN 3.1, 3.2):
- ``compile_fx(gm, inputs, inner_compile=..., config_patches=...)`` exists in every release; the inner
  compile receives ``cudagraphs`` (a ``BoxedBool``) and ``static_input_idxs`` as keyword arguments.
- ``CUDAGraph(keep_graph=True)`` + ``raw_cuda_graph()`` exist from 2.8; before that the graph being
  captured is only reachable through the driver (``grace.compat.cuda.capturing_graph``).
- Dynamo marks parameters and buffers that it passes as graph inputs with ``_dynamo_static_input_type``
  (on the tensor and in the placeholder's ``tensor_dict`` meta); older releases keep parameters as
  ``get_attr`` nodes, so they are no inputs at all.
- ``torch._dynamo.reset`` calls ``reset()`` on every cached backend that has one.
- Inductor sets ``TRITON_PTXAS_PATH``, when unset, to a ptxas torch ships (``torch/bin/ptxas`` in 2.11,
  ``torch/_inductor/bin/ptxas`` in 2.13) before it compiles Triton kernels, which are then written for
  that ptxas; a process loading them from Inductor's cache never sets it (``inductor_worker_ptxas``).
- cuBLAS keeps one workspace per (handle, stream), allocated lazily on a stream's first matmul and held
  until ``torch._C._cuda_clearCublasWorkspaces()``; one allocated during a capture lands in its pool.
- Dynamo counts top-level calls of compiled functions (``GenerationTracker.generation``), and
  ``cudagraph_mark_step_begin()`` counts ``MarkStepBox.mark_step_counter`` down from 0;
  ``torch._C._storage_Use_Count`` counts the holders of a storage, not its weak references.
- Dynamo's C++ ``TensorGuards`` checks tensor metadata in one call; its constructor's keywords are
  probed, with the Python signature as the fallback.

Invariant: nothing here runs CUDA work at import; importing works on CPU-only builds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import operator
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from grace.compat import aot as aot_compat
from grace.compat.aot import InnerGraph
from grace.compat.inductor_config import functorch_patched, inductor_patches

logger = logging.getLogger(__name__)

TORCH_VERSION: str = torch.__version__.split("+")[0]


def triton_version() -> str | None:
    try:
        import triton
    except Exception:  # any failure means "no usable Triton"
        return None
    return str(getattr(triton, "__version__", "unknown"))


def cuda_runtime_version() -> str | None:
    return torch.version.cuda


@functools.cache
def cuda_available() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


# --- CUDA graph object -------------------------------------------------------------------------


def _cuda_graph_class() -> Any:
    return getattr(torch.cuda, "CUDAGraph", None)


@functools.cache
def has_keep_graph() -> bool:
    """``CUDAGraph(keep_graph=True)`` with ``raw_cuda_graph()`` and an explicit ``instantiate()``."""
    cls = _cuda_graph_class()
    if cls is None or not hasattr(cls, "raw_cuda_graph") or not hasattr(cls, "instantiate"):
        return False
    try:
        return "keep_graph" in inspect.signature(cls.__new__).parameters
    except (TypeError, ValueError):
        return False


@functools.cache
def has_raw_cuda_graph_exec() -> bool:
    cls = _cuda_graph_class()
    return cls is not None and hasattr(cls, "raw_cuda_graph_exec")


def graph_exec_handle(graph: Any) -> int | None:
    """The ``cudaGraphExec_t`` of an instantiated ``torch.cuda.CUDAGraph`` as an int, or None.

    None where this torch has no ``raw_cuda_graph_exec`` (before 2.8) or the graph has no executable.
    """
    getter = getattr(graph, "raw_cuda_graph_exec", None)
    if not callable(getter):
        return None
    try:
        handle = int(getter())
    except Exception:
        return None
    return handle or None


def new_cuda_graph(keep_graph: bool) -> Any:
    """A fresh ``torch.cuda.CUDAGraph``; ``keep_graph`` only where ``has_keep_graph()``."""
    cls = _cuda_graph_class()
    if keep_graph:
        if not has_keep_graph():
            raise RuntimeError("this torch has no CUDAGraph(keep_graph=True); use the in-capture handle")
        return cls(keep_graph=True)
    return cls()


def capture_begin(graph: Any, pool: Any = None) -> None:
    """Begin capture on the current stream; thread-local capture mode as cudagraph trees use."""
    if pool is None:
        graph.capture_begin(capture_error_mode="thread_local")
    else:
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")


def graph_pool(graph: Any) -> Any:
    """The id of a captured ``torch.cuda.CUDAGraph``'s memory pool, for another ``capture_begin``."""
    return graph.pool()


# Held by grace.capture around every capture and warm-up on its side stream, and here around each clear:
# a clear from another thread in the middle of a capture would free the workspace the graph is using.
capture_lock = threading.RLock()


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's cached workspaces: the next matmul on each stream allocates its own again (never
    while another thread captures: ``capture_lock``)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and torch.cuda.is_initialized():
        with capture_lock:
            clear()


def hand_back_cached_segments() -> None:
    """Return the caching allocator's unused segments to the device, released graphs' pools among them.

    Resetting a graph only marks its private pool freeable: its segments stay reserved until
    ``empty_cache`` or an allocation that fails without them. Called by grace.pools after releasing
    pools, under ``capture_lock``; never while a stream of this thread captures."""
    if torch.cuda.is_available() and torch.cuda.is_initialized() and not is_current_stream_capturing():
        torch.cuda.empty_cache()


@functools.cache
def _generation_sources() -> tuple[Any, Any]:
    from torch._dynamo.mutation_guard import GenerationTracker

    try:
        from torch._inductor.cudagraph_trees import MarkStepBox
    except Exception:  # no Inductor CUDA graph trees: only Dynamo's count
        return GenerationTracker, None
    return GenerationTracker, MarkStepBox


def compiled_call_generation() -> int:
    """Which top-level call of a compiled function runs now, as cudagraph trees tell it: the user's
    ``cudagraph_mark_step_begin()`` count (negative) once used, else Dynamo's count of entries."""
    tracker, box = _generation_sources()
    if box is not None and box.mark_step_counter != 0:
        return int(box.mark_step_counter)
    return int(tracker.generation)


def storage_use_count(ref: Any) -> int:
    """Tensors (and Python storage objects) holding the storage of a ``StorageWeakRef``'s ``cdata``."""
    return int(torch._C._storage_Use_Count(ref.cdata))


class StoragesHeld:
    """Whether any of some storages is held by more than its own count, given ``(StorageWeakRef, own
    count)`` pairs: the steady replay's check over many outputs, run as C loops (no Python frame per
    storage)."""

    __slots__ = ("cdatas", "owns")

    def __init__(self, pairs: Sequence[tuple[Any, int]]) -> None:
        self.cdatas = [ref.cdata for ref, _ in pairs]
        self.owns = [own for _, own in pairs]

    def __call__(self) -> bool:
        return any(map(operator.gt, map(torch._C._storage_Use_Count, self.cdatas), self.owns))


def storage_weak_ref(tensor: torch.Tensor) -> Any:
    """A weak reference to ``tensor``'s storage (it does not count in ``storage_use_count``)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage())


def is_current_stream_capturing() -> bool:
    """Whether the current CUDA stream captures; False without CUDA (a CPU build has no such call)."""
    return torch.cuda.is_available() and bool(torch.cuda.is_current_stream_capturing())


def current_raw_stream(device: torch.device) -> int:
    """The ``cudaStream_t`` of ``device``'s current stream, without building a ``torch.cuda.Stream``
    (``torch._C._cuda_getCurrentRawStream``, which Inductor's generated code calls)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


# --- Inductor ----------------------------------------------------------------------------------


@dataclass
class InnerCompileRecord:
    """What Inductor's inner compile told us, when it ran (warm caches may skip it)."""

    calls: int = 0
    static_input_idxs: list[tuple[int, ...]] = field(default_factory=list)
    is_inference: list[bool] = field(default_factory=list)
    output_codes: list[Any] = field(default_factory=list)


InnerGraphHook = Callable[[InnerGraph], None]
"""Given each graph the inner compile made; it may ``install`` another entry (grace.training)."""


def _make_inner_compile(record: InnerCompileRecord, on_graph: InnerGraphHook | None) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool

    def grace_inner_compile(*args: Any, **kwargs: Any) -> Any:
        kwargs["cudagraphs"] = BoxedBool(False)
        record.calls += 1
        record.static_input_idxs.append(tuple(kwargs.get("static_input_idxs", ()) or ()))
        record.is_inference.append(bool(kwargs.get("is_inference", False)))
        out = compile_fx_inner(*args, **kwargs)
        if not kwargs.get("is_backward", False):
            record.output_codes.append(out)
        if on_graph is not None:
            inner = aot_compat.inner_graph(args, kwargs, out)
            if inner is not None:
                on_graph(inner)
        return out

    return grace_inner_compile


def compile_with_inductor(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    record: InnerCompileRecord,
    *,
    need_inner_outputs: bool,
    on_graph: InnerGraphHook | None = None,
    keep_donated: bool = False,
) -> Callable[..., Any]:
    """Inductor with its own CUDA graphs off (config and the inner compile's ``cudagraphs`` box).

    ``on_graph``: called with each graph the inner compile makes (AOTAutograd's cache, which would skip
    the inner compile, is off then, as it is when PI needs the inner outputs, and so are donated
    buffers unless ``keep_donated``: a backward that writes its saved tensors' memory must be restored
    before a second run, so grace counts its donated inputs as written, ``InnerGraph.donated``). Where
    donation is off, Inductor's FX graph cache is off with it: its key leaves out which inputs were
    donated (torch 2.11, 2.13), so a backward another compile cached with donated buffers (mode inductor,
    say) would come back writing its saved tensors, which grace would count as unwritten."""
    from torch._inductor.compile_fx import compile_fx

    # AOTAutograd's cache can skip the inner compile on a hit, and PI and ``on_graph`` need its output;
    # donated buffers let a backward reuse its saved tensors' memory, so it could not run twice as is.
    donation_off = on_graph is not None and not keep_donated
    with (
        functorch_patched(need_inner_outputs or on_graph is not None, enable_autograd_cache=False),
        functorch_patched(donation_off, donated_buffer=False),
    ):
        compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
            gm,
            list(example_inputs),
            inner_compile=_make_inner_compile(record, on_graph),
            config_patches=inductor_patches(donation_off=donation_off),
        )
    return compiled


def inductor_module_globals(output_code: Any) -> dict[str, Any] | None:
    """The globals of the Python module Inductor generated for ``output_code``, or None.

    The module holds the Triton kernels (``CachingAutotuner`` objects) that PI rewrites. Follows
    ``current_callable`` through ``functools.wraps`` chains and closures.
    """
    fn = getattr(output_code, "current_callable", None)
    seen: set[int] = set()
    todo = [fn]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        glb = getattr(item, "__globals__", None)
        if isinstance(glb, dict) and "call" in glb and any(k.startswith("triton_") for k in glb):
            return glb
        if isinstance(glb, dict) and "async_compile" in glb:
            return glb
        todo.append(getattr(item, "__wrapped__", None))
        todo.append(getattr(item, "func", None))  # functools.partial
        for cell in getattr(item, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                todo.append(cell.cell_contents)
    return None


# --- Dynamo ------------------------------------------------------------------------------------


def is_static_input(placeholder: torch.fx.Node | None, value: Any) -> bool:
    """Parameters and buffers Dynamo passes as inputs: their address is stable across calls."""
    if not isinstance(value, torch.Tensor):
        return False
    if isinstance(value, torch.nn.Parameter):
        return True
    if getattr(value, "_dynamo_static_input_type", None):
        return True
    if placeholder is not None:
        tensor_dict = placeholder.meta.get("tensor_dict", {})
        if isinstance(tensor_dict, dict) and tensor_dict.get("_dynamo_static_input_type"):
            return True
    return False


def node_example_value(node: torch.fx.Node) -> Any:
    meta = node.meta
    if "example_value" in meta:
        return meta["example_value"]
    return meta.get("val")


def graph_code_hash(gm: torch.fx.GraphModule) -> str:
    """A stable hash of the FX graph's code (names from Dynamo are deterministic per program)."""
    try:
        code = gm.code
    except Exception:
        code = str(gm.graph)
    return hashlib.sha256(code.encode()).hexdigest()[:24]


def register_backend(name: str, fn: Callable[..., Any]) -> bool:
    """Register ``fn`` as ``torch.compile(backend=name)``; False when another backend has the name."""
    from torch._dynamo.backends import registry

    compiler_fns = getattr(registry, "_COMPILER_FNS", None)
    if isinstance(compiler_fns, dict) and name in compiler_fns:
        return compiler_fns[name] is fn or getattr(compiler_fns[name], "__module__", "") == fn.__module__
    backends = getattr(registry, "_BACKENDS", None)
    if isinstance(backends, dict) and backends.get(name) is not None:
        # Dynamo discovered our entry point and registers it when first looked up (possibly right
        # now, while importing us): registering here too would be a duplicate.
        return True
    registry.register_backend(compiler_fn=fn, name=name)
    return True


def install_dynamo_reset_hook(callback: Callable[[], None]) -> None:
    """Make ``torch._dynamo.reset()`` call ``callback``.

    Releases that reset cached backends call ``backend.reset()`` already (the grace backends carry one);
    for the others, ``torch._dynamo.reset`` is wrapped once.
    """
    import torch._dynamo
    import torch._dynamo.eval_frame as eval_frame

    if hasattr(eval_frame, "_reset_guarded_backend_cache"):
        return
    current = torch._dynamo.reset
    if getattr(current, "_grace_wrapped", False):
        return

    @functools.wraps(current)
    def reset() -> None:
        current()
        callback()

    reset._grace_wrapped = True  # type: ignore[attr-defined]
    torch._dynamo.reset = reset


# --- tensors -----------------------------------------------------------------------------------


_DATA_PTRS_AT_INDICES_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


def data_ptrs_equal(tensors: Sequence[Any], data_ptrs: Sequence[int | None], indices: Sequence[int]) -> bool:
    """``tensors[i].data_ptr() == data_ptrs[i]`` for every ``i`` in ``indices`` (C++ where torch has it,
    probed once; asked on every replay, so no index costs nothing).

    ``data_ptrs`` is indexed like ``tensors`` (None at the indices that are not checked).
    """
    if not indices:
        return True
    fast = _DATA_PTRS_AT_INDICES_EQUAL
    if fast is not None:
        return bool(fast(list(tensors), list(data_ptrs), list(indices)))
    return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)


def _tensor_guards_class() -> Any:
    try:
        from torch._C._dynamo.guards import TensorGuards
    except Exception:  # no Dynamo guards extension in this build
        return None
    return TensorGuards


def _new_tensor_guards(cls: Any, tensors: Sequence[torch.Tensor]) -> Any:
    # Every dimension is passed as a fixed int: the check compares all sizes and strides. The keywords are
    # required (constructing without them crashes the interpreter on 2.13), so they are always given.
    return cls(
        *tensors,
        dynamic_dims_sizes=[[int(n) for n in t.size()] for t in tensors],
        dynamic_dims_strides=[[int(n) for n in t.stride()] for t in tensors],
    )


@functools.cache
def has_tensor_metadata_check() -> bool:
    """Dynamo's C++ ``TensorGuards`` takes ``dynamic_dims_sizes``/``dynamic_dims_strides`` (2.1 and later)
    and rejects what grace's signatures distinguish: probed on small CPU tensors, never assumed."""
    cls = _tensor_guards_class()
    if cls is None:
        return False
    try:
        base = torch.empty(2, 3)
        check = _new_tensor_guards(cls, [base]).check
        return (
            bool(check(torch.empty(2, 3)))
            and not check(torch.empty(3, 2))
            and not check(torch.empty(3, 2).t())
            and not check(torch.empty(2, 3, dtype=torch.float64))
            and not check(torch.empty(2, 3, 1))
            and not check(3)
        )
    except Exception:
        return False


def tensor_metadata_check(tensors: Sequence[torch.Tensor]) -> Callable[..., bool] | None:
    """A C++ predicate over as many tensors as ``tensors``: True only when each has the same Python type,
    dtype, device, dispatch keys, requires_grad, sizes and strides as its counterpart had here; None where
    this torch has no such check. Stricter than shape, stride and dtype: a False means "look closer"."""
    if not has_tensor_metadata_check():
        return None
    try:
        return cast(Callable[..., bool], _new_tensor_guards(_tensor_guards_class(), tensors).check)
    except Exception:
        return None


def foreach_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Copy each src into its dst, in as few launches as the release allows."""
    if not dsts:
        return
    if len(dsts) > 1 and hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dsts, srcs)
        return
    for dst, src in zip(dsts, srcs, strict=True):
        dst.copy_(src)


def device_name(device: torch.device) -> str:
    return str(torch.cuda.get_device_name(device))


def inductor_worker_ptxas() -> str | None:
    """The ptxas Inductor hands Triton: ``TRITON_PTXAS_PATH`` when set, else the first executable ptxas
    that this torch ships (``torch/bin``, ``torch/_inductor/bin``), else None (Triton's own)."""
    named = os.environ.get("TRITON_PTXAS_PATH")
    if named:
        return named
    root = Path(torch.__file__).parent
    for shipped in (root / "bin" / "ptxas", root / "_inductor" / "bin" / "ptxas"):
        if shipped.is_file() and os.access(shipped, os.X_OK):
            return str(shipped)
    return None
