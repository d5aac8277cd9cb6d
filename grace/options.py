"""User-facing options of the grace backend.

Problem: options reach the backend three ways (``grace.compile(model, options)``,
``torch.compile(model, backend="grace", options={...})`` and defaults), and each technique must be
switchable on its own for ablations (``grace-cgct``, ``grace-cgct-pi``).

Design: one frozen dataclass, ``GraceOptions``; every field is declared once with its default and its
documentation; ``GraceOptions.from_value`` turns a mapping or ``None`` into an instance and rejects
unknown keys with the list of valid ones. Options are immutable so that a compiled callable's behaviour
cannot change behind its back.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "GRACE_CACHE_DIR"
PI_TABLE_UPDATES = ("copy", "node")  # values of GraceOptions.pi_table_update
PI_VENDOR_UPDATES = ("host", "device")  # values of GraceOptions.pi_vendor_update
TRAINING_OUTPUT_SETS = 16  # GraceOptions.max_output_sets=None for a training step's forward and backward


class GraceOptionsError(ValueError):
    """An option has an invalid value or name; the message says which and what is accepted."""


@dataclass(frozen=True)
class GraceOptions:
    """Options of the grace backend.

    Attributes:
        cuda_graphs: capture Inductor's output in CUDA graphs at all. False runs Inductor alone.
        cgct: apply CUDA-graph-aware code transformation (``grace.cgct``) before Inductor.
        pi: try parameter indirection (``grace.pi``) so that replays do not copy inputs.
        pi_table_update: how PI's pointer table gets this call's addresses: ``"copy"``, one small
            host-to-device copy before each replay (``grace.pi.table``); ``"node"``, a kernel node at
            the head of the graph whose arguments are updated in the executable graph, so the update
            travels with the launch (``grace.pi.fill``). Where ``"node"`` cannot be used (too many
            slots, no NVRTC, a torch without an executable graph handle) the copy serves the table and
            the PI stage ``table`` says why. Default ``"node"``, the faster of the two (docs/design/pi.md).
        pi_vendor_update: how vendor kernels (cuBLAS) that read a dynamic input get this call's
            addresses: ``"host"``, their arguments are updated in the executable graph from the host when
            an address changes (grace.pi.vendor_host); ``"device"``, the nodes are marked device-updatable
            and a prelude kernel rewrites them on every replay (grace.pi.vendor). Default ``"host"``: a
            graph with such a prelude once never finished a replay under ``torch.profiler`` with CUDA
            activities (docs/design/pi.md).
        pi_direct: capture the PI graph on the caller's own inputs, with no placeholders, and do not
            capture the graph-with-copies variant when that graph's PI serves every dynamic input: the
            decision then holds no copy of the inputs (placeholders are allocated only if a later call
            needs a copy, e.g. an input that breaks a kernel's alignment). When a dynamic input cannot be
            served (or two inputs share a storage, or an output views an input) the usual two variants
            are captured instead; the skip reason ``pi_direct_declined`` says why. Default True: the
            first calls' peak memory is then pt2cg's (docs/design/pi.md).
        scg: selective CUDA graphs: time the variants and keep the fastest one. False always keeps a
            graph when one could be captured and passed its numeric check (PI if it works, else copies).
        scg_samples: timed samples per variant (median taken); at least 3.
        scg_warmup: untimed runs per variant before the samples.
        scg_margin: how much faster (a fraction of its median) the no-graph variant must be than the
            fastest graph variant to be chosen; a nearer tie goes to the graph, which also frees the
            host. SCG times each variant alone with the device idle, where launching kernels one by
            one costs nothing beside a GPU-bound graph; in a step, that host work delays whatever
            follows. 0 takes the smaller median.
        scg_copies_bytes: under ``pi_direct``, a PI graph that stands alone is timed beside a graph
            with input copies when the dynamic inputs and the PI graph's outputs each hold at most this
            many bytes (copying small inputs may beat PI's table update; Note: [Copies beside a PI
            graph alone] in grace.decide). 0 never captures the second graph.
        cache_dir: directory of the persistent SCG decision cache; None uses ``$GRACE_CACHE_DIR`` or
            the user cache directory (``$XDG_CACHE_HOME/grace`` or ``~/.cache/grace``).
        persist_decisions: read and write SCG decisions in ``cache_dir``.
        clone_outputs: return clones of graph outputs. Without it, outputs live in the graph's memory
            pool and the graph's replay in the next call of the compiled model overwrites them (as with
            PyTorch's cudagraph trees): clone what you keep across calls, or set this. Within one call a
            replay never overwrites an output still held: that call runs without the graph (Note:
            [Outputs held within one call] in grace.outputs). Nor does a replay overwrite an output
            that a call from another thread still holds (Note: [Outputs and threads]): once grace runs
            calls from several threads, a graph replays only when none of its outputs is held. Set this
            when several threads call compiled models, so that every call can replay.
        max_graphs_per_callable: bound on graphs kept per compiled callable, one per input signature
            (shapes, strides, dtypes, integer inputs); the least recently used one is released (its
            memory pool once no output of it is held, grace.pools).
        warmup_calls: calls run without a graph before the first capture of a signature (calls with
            its shapes but an input on another device count: grace.runner's Note: [Warm-up per
            signature, not per placement]); with ``step_pool``, steps of a training graph.
        check_numerics: compare each graph variant's outputs with the no-graph outputs once, before
            keeping it. Turning this off is unsafe and only meant for debugging.
        host_reference_bytes: for a callable that mutates none of its inputs, the deciding call runs
            the no-graph reference before any capture; when its outputs hold at least this many bytes,
            they are copied to host memory and freed, the no-graph variant's SCG samples are taken
            before the capture too, and the graph variants (the returned replay included) are compared
            with the host copy, chunk by chunk: no no-graph output shares the device with a graph's
            outputs (Note: [Deciding-call memory] in docs/design/runtime.md). Such a graph is compared
            with the no-graph callable again at its first call with inputs at other addresses, not at its
            first steady call. For a callable that mutates inputs, the copies its checks keep of them
            (before a run, to restore them; after the reference run, to compare) and of the outputs
            go to host memory from this size on. 0 turns both off.
        max_recaptures: times a graph is captured again because its static inputs (parameters,
            buffers) moved to new addresses and it could not be rebound, before giving up on graphs for
            that signature. The graphs of earlier addresses are kept and used again when those addresses
            come back (one callable serving several layers).
        max_rebinds: graphs of one signature made by rebinding (option ``rebind``) for other addresses
            of the static inputs; past it, moves are captured (within ``max_recaptures``). A rebound
            graph has no memory pool of its own (its executable graph and, with PI, a pointer table), so
            this bound is larger. A signature holds at most 1 + max_recaptures + max_rebinds graphs.
        max_output_sets: sets of outputs one signature's graph may have for the same static inputs
            (Note: [Output sets] in grace.outputsets): when a replay would overwrite outputs that something
            is counted to hold (a forward's saved tensors while its backward is pending, a layer's
            gradients that are a ``.grad``, outputs held within one call), the graph is captured once
            more with outputs of its own, up to this many in all; past it, such calls run without the
            graph. Each set is a graph with its own memory pool. None (the default) gives the forward
            and backward graphs of a training step ``TRAINING_OUTPUT_SETS`` (one compiled layer called
            for every layer of a model needs one set per layer: docs/design/training.md) and every
            other graph one set.
        output_sets_share_pool: capture a training graph's further output sets into the pool of its
            first set (Note: [Graphs in one pool] in grace.poolgroups) instead of a pool each: a set
            then replays only while no output of a set captured after it is held. False (the default
            until it is measured on a GPU) gives every set a pool of its own.
        step_pool: capture every training graph of a device (AOTAutograd's forwards and backwards,
            their output sets) into one memory pool (Note: [A training step in one pool] in
            grace.poolgroups) instead of a pool each: a graph replays only while no output it may
            overwrite, by the pool's layout around its capture, is still needed; their warm-up is
            counted in steps, not calls (Note: [Captures of a step in one step] in grace.warmup). False
            (the default until it is measured on a GPU) gives every graph a pool of its own.
        donated_buffers: let a training backward reuse its saved tensors' memory for its own
            buffers, as AOTAutograd does by default (``torch._functorch.config.donated_buffer``) and
            grace otherwise turns off: the backward then counts those inputs as inputs it writes, so its
            deciding call restores them before every extra run (grace.rerun) and SCG takes its variant
            untimed. False (the default until it is measured on a GPU) compiles without donation.
        rebind: when the static inputs move, make the new graph by editing their addresses in a copy
            of the captured one (grace.rebind) instead of capturing again: every graph of the signature
            then shares one memory pool and one set of outputs, as cudagraph trees' recordings share
            theirs, and no deciding call is made. Where the graph cannot follow the move (see
            grace.rebind for when), it is captured again and the skip reason ``rebind_declined`` says
            why. Needs a torch that keeps captured graphs (2.8+) and cuda-bindings.
        training: for a graph that needs autograd, run the forward and backward graphs AOTAutograd
            compiles with runners of their own (grace.training), each with the variants, PI and SCG of
            any graph; a forward never replays over tensors saved for a pending backward, nor a backward
            over gradients still held (Note: [Outputs autograd keeps] in grace.outputs). False runs such
            graphs with Inductor alone, as grace did before.
    """

    cuda_graphs: bool = True
    cgct: bool = True
    pi: bool = True
    pi_table_update: str = "node"
    pi_vendor_update: str = "host"
    pi_direct: bool = True
    scg: bool = True
    scg_samples: int = 15
    scg_warmup: int = 2
    scg_margin: float = 0.03
    scg_copies_bytes: int = 1 << 20
    cache_dir: str | None = None
    persist_decisions: bool = True
    clone_outputs: bool = False
    max_graphs_per_callable: int = 8
    warmup_calls: int = 1
    check_numerics: bool = True
    host_reference_bytes: int = 4 << 20
    max_recaptures: int = 3
    rebind: bool = True
    max_rebinds: int = 64
    max_output_sets: int | None = None
    output_sets_share_pool: bool = False
    step_pool: bool = False
    donated_buffers: bool = False
    training: bool = True

    def __post_init__(self) -> None:
        for name in (
            "cuda_graphs",
            "cgct",
            "pi",
            "pi_direct",
            "scg",
            "persist_decisions",
            "clone_outputs",
            "check_numerics",
            "rebind",
            "training",
            "output_sets_share_pool",
            "step_pool",
            "donated_buffers",
        ):
            if not isinstance(getattr(self, name), bool):
                raise GraceOptionsError(f"GraceOptions.{name} must be a bool, got {getattr(self, name)!r}")
        minimums = {
            "scg_samples": 3,
            "scg_warmup": 0,
            "max_graphs_per_callable": 1,
            "warmup_calls": 0,
            "max_recaptures": 0,
            "max_rebinds": 0,
            "host_reference_bytes": 0,
            "scg_copies_bytes": 0,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GraceOptionsError(f"GraceOptions.{name} must be an int >= {low}, got {value!r}")
        sets = self.max_output_sets
        if sets is not None and (isinstance(sets, bool) or not isinstance(sets, int) or sets < 1):
            raise GraceOptionsError(f"GraceOptions.max_output_sets must be an int >= 1 or None, got {sets!r}")
        margin = self.scg_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise GraceOptionsError(f"GraceOptions.scg_margin must be a number in [0, 1), got {margin!r}")
        for name, choices in (("pi_table_update", PI_TABLE_UPDATES), ("pi_vendor_update", PI_VENDOR_UPDATES)):
            value = getattr(self, name)
            if value not in choices:
                raise GraceOptionsError(f"GraceOptions.{name} must be one of {list(choices)}, got {value!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise GraceOptionsError(f"GraceOptions.cache_dir must be a path or None, got {self.cache_dir!r}")

    def output_sets(self, *, training: bool) -> int:
        """Option ``max_output_sets`` for a training step's graph (``training``) or any other graph."""
        if self.max_output_sets is not None:
            return self.max_output_sets
        return TRAINING_OUTPUT_SETS if training else 1

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_value(cls, value: GraceOptions | Mapping[str, Any] | None) -> GraceOptions:
        """Accept an instance, a mapping of field names (as ``torch.compile(options=...)`` passes) or None."""
        if value is None:
            return cls()
        if isinstance(value, GraceOptions):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(cls.field_names()))
            if unknown:
                raise GraceOptionsError(
                    f"unknown grace option(s) {unknown}; valid options are {list(cls.field_names())}"
                )
            return cls(**dict(value))
        raise GraceOptionsError(
            f"grace options must be GraceOptions, a mapping or None, got {type(value).__name__}"
        )

    def replace(self, **changes: Any) -> GraceOptions:
        return dataclasses.replace(self, **changes)

    def resolved_cache_dir(self) -> Path:
        """The directory that holds persistent decisions (not created here)."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        env = os.environ.get(CACHE_DIR_ENV)
        if env:
            return Path(env)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "grace"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}
