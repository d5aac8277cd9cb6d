"""What CGCT needs from Dynamo, FX and Inductor, and how those pieces differ between torch 2.4 and 2.15.

Problem: CGCT reads Dynamo's graphs (placeholder sources, fake example values, static-input marks) and
mirrors Inductor's reasons for refusing or splitting CUDA graphs. Those live in private modules that
moved, were renamed or changed behaviour between releases:

- graph partitions (``torch._inductor.config.graph_partition``) exist from 2.8 and are on by default
  from 2.9; with them, CPU nodes, device copies and unsafe ops split a graph into partitions instead
  of disabling CUDA graphs for the whole Dynamo graph;
- mutation of static inputs and of tensors that cudagraph trees already manage is supported from 2.5
  (``triton.cudagraph_support_input_mutation``);
- the "complex memory overlap" test on inputs disappeared in recent releases;
- the forbidden-op list moved from a local set inside ``has_incompatible_cudagraph_ops`` (2.4) to
  ``torch._inductor.utils.FORBIDDEN_CUDAGRAPH_OPS``; the ``cudagraph_unsafe`` op tag is newer still;
- a placeholder's Dynamo source is ``node._dynamo_source`` in new releases and
  ``node.meta["grapharg"].source`` in old ones; ``Source.name`` turned from a method into a property;
- a backend cannot make Dynamo restart a frame with plain ``RestartAnalysis``: Dynamo wraps whatever
  the backend raises into ``BackendCompilerFailed`` except a few types. See Note [Asking Dynamo to
  retrace].

Design: every probe runs once (``functools.cache``) and is exposed as a capability or a small function
with the same signature on every version. Nothing else in ``grace.cgct`` imports private torch modules.

Invariant: functions here never raise for a version that lacks a feature; they return the value that
describes the old behaviour (``False``, ``None``, an empty set), so callers need no version checks.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

# FX's tree utilities and the dispatch mode base, from private modules on every release: CGCT uses them
# through these names only.
from torch.utils._python_dispatch import TorchDispatchMode as TorchDispatchMode
from torch.utils._pytree import tree_flatten as tree_flatten
from torch.utils._pytree import tree_map as tree_map

log = logging.getLogger(__name__)

# Forbidden ops as listed by torch 2.4 (inside has_incompatible_cudagraph_ops); used only when the
# running torch does not expose its own list.
_FORBIDDEN_OPS_2_4 = frozenset(
    {
        "aten._fused_moving_avg_obs_fq_helper.default",
        "aten._fused_moving_avg_obs_fq_helper_functional.default",
        "aten.multinomial.default",
        "fbgemm.dense_to_jagged.default",
        "fbgemm.jagged_to_padded_dense.default",
        "run_and_save_rng_state",
        "run_with_rng_state",
        "aten._local_scalar_dense",
        "aten._assert_scalar",
    }
)

# Callables in a Dynamo graph that change process-wide state (grad mode, autocast) rather than compute.
_GLOBAL_STATE_CALLABLES = frozenset(
    {
        "_set_grad_enabled",
        "set_grad_enabled",
        "_enter_autocast",
        "_exit_autocast",
        "_set_deterministic_algorithms",
        "_set_fwd_grad_enabled",
        "_enable_functionalization",
        "_disable_functionalization",
    }
)


@functools.cache
def torch_version() -> tuple[int, int]:
    """(major, minor) of the running torch, for logs and reports only; code tests capabilities."""
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _inductor_config() -> Any:
    import torch._inductor.config as config

    return config


def graph_partition_enabled() -> bool:
    """Whether Inductor splits graphs around CPU / unsafe nodes right now (False where unknown)."""
    return bool(getattr(_inductor_config(), "graph_partition", False))


@functools.cache
def graph_partition_supported() -> bool:
    return hasattr(_inductor_config(), "graph_partition")


def input_mutation_supported() -> bool:
    """Whether cudagraph trees accept mutation of tensors they manage (2.5+)."""
    return bool(getattr(_inductor_config().triton, "cudagraph_support_input_mutation", False))


def skip_dynamic_graphs() -> bool:
    return bool(getattr(_inductor_config().triton, "cudagraph_skip_dynamic_graphs", False))


@functools.cache
def checks_complex_memory_overlap() -> bool:
    """Whether this Inductor refuses CUDA graphs for inputs with internal memory overlap."""
    for module_name in ("torch._inductor.output_code", "torch._inductor.compile_fx"):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            continue
        function = getattr(module, "complex_memory_overlap", None)
        if function is not None:
            try:
                return "complex memory overlap" in inspect.getsource(module)
            except (OSError, TypeError):
                return True
    return False


# Collectives reach Dynamo graphs as ops of the `_c10d_functional` namespace (the native functional
# collectives of torch 2.3 and later, also what Dynamo rewrites in-place torch.distributed calls into);
# torch before 2.3 named it `c10d_functional`. Python-level calls of torch.distributed count too.
_COLLECTIVE_NAMESPACES = ("_c10d_functional.", "c10d_functional.")


def collective_name(target: object) -> str | None:
    """The name of a collective communication op (an FX node target), or None for anything else."""
    text = str(target)
    if text.startswith(_COLLECTIVE_NAMESPACES):
        return text
    module = getattr(target, "__module__", None) or ""
    if module.startswith("torch.distributed") and callable(target):
        return f"{module}.{getattr(target, '__name__', text)}"
    return None


def distributed_world_size() -> int:
    """The size of the default process group, 1 when torch.distributed is absent or not initialized."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size())


@functools.cache
def forbidden_cudagraph_ops() -> frozenset[str]:
    """String forms of the ops Inductor never captures (``str(OpOverload)``)."""
    try:
        from torch._inductor import utils as inductor_utils
    except ImportError:  # pragma: no cover - Inductor ships with every supported torch
        return _FORBIDDEN_OPS_2_4
    listed = getattr(inductor_utils, "FORBIDDEN_CUDAGRAPH_OPS", None)
    return frozenset(listed) if listed else _FORBIDDEN_OPS_2_4


def has_cudagraph_unsafe_tag(op: object) -> bool:
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    tags = getattr(op, "tags", ())
    return tag is not None and tag in tags


def caching_allocator_disabled() -> bool:
    """The environment switch that makes Inductor skip capture on every graph."""
    return os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") not in ("", "0")


def allowed_input_types() -> tuple[type, ...]:
    """Input types Inductor accepts for CUDA graphs (newer releases added generators)."""
    types: list[type] = [torch.Tensor, torch.SymInt]
    if torch_version() >= (2, 5):
        types.append(torch.Generator)
    return tuple(types)


# ---------------------------------------------------------------------------------------------------
# Values and symbols


def node_value(node: torch.fx.Node) -> Any:
    """The fake value a tracer recorded: ``val`` (make_fx, AOT, export) or ``example_value`` (Dynamo)."""
    if "val" in node.meta:
        return node.meta["val"]
    return node.meta.get("example_value")


def set_node_value(node: torch.fx.Node, value: Any) -> None:
    """Replace the recorded fake value under the key(s) the tracer used."""
    wrote = False
    for key in ("val", "example_value"):
        if key in node.meta:
            node.meta[key] = value
            wrote = True
    if not wrote:
        node.meta["example_value"] = value


def is_symbolic(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))
    return False


def has_unbacked_symbols(value: Any) -> bool:
    try:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    except ImportError:  # pragma: no cover
        return False
    try:
        return bool(free_unbacked_symbols(value))
    except Exception:  # a value free_unbacked_symbols cannot walk holds no symbols we can see
        return False


def concrete_int(value: Any) -> int:
    """An int for a possibly symbolic size: its hint (the value seen at trace time)."""
    if isinstance(value, int):
        return value
    node = getattr(value, "node", None)
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    shape_env = getattr(node, "shape_env", None)
    if node is not None and shape_env is not None:
        return int(shape_env.size_hint(node.expr))
    return int(value)


def is_fake(value: object) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def new_fake_mode() -> Any:
    """A private FakeTensorMode with a shape env, so data-dependent ops yield unbacked symbols."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


@contextlib.contextmanager
def no_active_fake_mode() -> Iterator[None]:
    """Run real computations even when called from inside a tracing fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def fake_on_device(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor like ``value`` (same fake mode, shape, strides, dtype) placed on ``device``."""
    mode = getattr(value, "fake_mode", None)
    context = mode if mode is not None else contextlib.nullcontext()
    with context:
        return torch.empty_strided(
            value.shape, value.stride(), dtype=value.dtype, device=device, requires_grad=False
        )


def fake_like(reference: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A fake tensor in ``reference``'s fake mode with ``value``'s shape, strides, dtype and device."""
    mode = getattr(reference, "fake_mode", None)
    context = mode if mode is not None else contextlib.nullcontext()
    with context:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def mark_static_input(node: torch.fx.Node, tensor: torch.Tensor) -> None:
    """Tell Dynamo/AOT that a placeholder holds a tensor with a stable address (no copy per replay)."""
    tensor_dict = node.meta.get("tensor_dict")
    if isinstance(tensor_dict, dict):
        # A copy: a cloned graph shares its nodes' meta dicts with the graph Dynamo gave.
        node.meta["tensor_dict"] = {**tensor_dict, "_dynamo_static_input_type": "unguarded"}
    with contextlib.suppress(Exception):
        torch._dynamo.mark_static_address(tensor, guard=False)


def adopt_example_context(replacement: torch.Tensor, original: Any) -> bool:
    """Let AOTAutograd fake ``replacement`` (a GPU tensor CGCT puts in place of example input
    ``original``, of the same shape) as Dynamo faked ``original``: the same symbolic context, so the
    same size symbols, each with the source Dynamo gave it.

    A real example input AOTAutograd finds no context for is faked with fresh dynamic symbols that have
    no source; a guard Inductor then puts on one (32-bit indexing, a size check) cannot be turned into
    Dynamo guard code and compiling fails (an ``IndexError`` in ``issue_guard``). True when adopted."""
    try:
        tracing = torch._guards.TracingContext.try_get()
        table = getattr(tracing, "tensor_to_context", None)
        if table is None or not isinstance(original, torch.Tensor) or original not in table:
            return False
        table[replacement] = table[original]
    except Exception:  # the mapping is private: without it the replacement is faked as before
        log.debug("grace: could not adopt the example input's symbolic context", exc_info=True)
        return False
    return True


# ---------------------------------------------------------------------------------------------------
# Dynamo sources


def _source_of(node: torch.fx.Node) -> Any:
    source = getattr(node, "_dynamo_source", None)
    if source is None:
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
    return source


def placeholder_source_name(node: torch.fx.Node) -> str | None:
    """``L['self'].anchors``-style name of where Dynamo read a placeholder from, or None."""
    source = _source_of(node)
    if source is None:
        return None
    name = source.name
    if callable(name):
        name = name()
    return str(name)


def is_attribute_source(name: str | None) -> bool:
    """True for values read from an object's attribute or a global, false for a caller's argument.

    ``L['x']`` and ``L['xs'][0]`` are the caller's inputs; ``L['self'].anchors``,
    ``L['self']._modules['head']._buffers['anchors']``, ``G['TABLE']`` are state that outlives a call.
    Values Dynamo rebuilds on every call (numpy arrays turned into tensors) are inputs, not state.
    """
    if not name or "numpy" in name:
        return False
    if name.startswith("G["):
        return True
    rest = name
    # Attribute access outside brackets: a dot followed by an identifier.
    depth = 0
    quoted: str | None = None
    for index, char in enumerate(rest):
        if quoted:
            if char == quoted:
                quoted = None
            continue
        if char in "'\"":
            quoted = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "." and depth == 0 and rest[index + 1 : index + 2].isidentifier():
            return True
    return False


def global_state_callable(target: object) -> bool:
    """Graph nodes that flip grad mode or autocast; analysis must not run them."""
    return getattr(target, "__name__", "") in _GLOBAL_STATE_CALLABLES


# ---------------------------------------------------------------------------------------------------
# Graph modules


def clone_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose graph can be rewritten without touching the original.

    Keeps what Dynamo and AOTAutograd read beside the graph: ``gm.meta`` (``dynamo_compile_id``), the
    ``_param_name_to_source`` / ``_source_to_user_stacks`` attributes and each placeholder's
    ``_dynamo_source``. Attributes (parameters, buffers, constants) are shared, not copied.
    """
    new_graph = copy.deepcopy(gm.graph)
    clone = torch.fx.GraphModule(gm, new_graph, class_name=type(gm).__name__)
    clone.meta = dict(getattr(gm, "meta", {}))
    for key in ("_param_name_to_source", "_source_to_user_stacks"):
        if hasattr(gm, key):
            setattr(clone, key, getattr(gm, key))
    for old, new in zip(gm.graph.nodes, clone.graph.nodes, strict=True):
        copy_node_attributes(old, new)
    return clone


def is_op_overload(target: object) -> bool:
    """Whether an FX node's target is an ATen operator overload (``torch.ops.aten.x.default``)."""
    return isinstance(target, torch._ops.OpOverload)


def copy_node_attributes(old: torch.fx.Node, new: torch.fx.Node) -> None:
    if hasattr(old, "_dynamo_source"):
        new._dynamo_source = old._dynamo_source  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------
# Note [Asking Dynamo to retrace]
# Dynamo calls the backend inside OutputGraph.call_user_compiler and turns any exception into
# BackendCompilerFailed, except an allow-list. Plain RestartAnalysis is not on it: a backend raising it
# fails the compile. TensorifyScalarRestartAnalysis, a RestartAnalysis subclass, is re-raised unwrapped
# by the releases that have the tensorify pass, and convert_frame's restart loop then traces the frame
# again (both verified: docs/design/cgct.md). On releases where no subclass passes through (2.4, 2.5),
# CGCT does not ask for a retrace: it mirrors the attribute on the GPU instead
# (grace/cgct/transforms/attributes.py).


@functools.cache
def restart_exception_type() -> type[BaseException] | None:
    """A RestartAnalysis subclass that a backend may raise to make Dynamo trace the frame again."""
    try:
        from torch._dynamo import exc
        from torch._dynamo.output_graph import OutputGraph
    except ImportError:  # pragma: no cover
        return None
    candidate = getattr(exc, "TensorifyScalarRestartAnalysis", None)
    if candidate is None:
        return None
    for name in ("_call_user_compiler", "call_user_compiler"):
        method = getattr(OutputGraph, name, None)
        if method is None:
            continue
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):
            continue
        if "TensorifyScalarRestartAnalysis" in source:
            return candidate
    return None
