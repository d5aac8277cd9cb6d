"""A workload prepared for the suites: built once, its references computed once, each mode compiled
once, shared by the correctness and the performance test of that workload in one process.

Problem: compiling a transformer in six modes costs minutes; doing it once for correctness and again for
performance would not fit a GPU lease. Design: ``prepare()`` keeps exactly one ``PreparedWorkload``
per process (the tests are ordered workload by workload, see suites/conftest.py); preparing another
workload closes the previous one, which drops its compiled artefacts and frees device memory.

Invariants:
- Each compiled mode gets its own deep copy of the model and its own inputs, so a mode that rewrites
  the module (CGCT moves CPU attributes) or writes its inputs cannot leak into another mode.
- A training workload's mode is a ``suites.training.TrainStep`` over its own deep copy (eager too):
  one call is one iteration, and compile and warm-up calls are training steps. The timing references
  are skipped for it (they replay one forward graph).
- ``compile_s`` is the wall time of the first call (Dynamo + backend compile + one run);
  ``peak_mem_bytes`` is the peak allocated during compile and warm-up above what was allocated before;
  ``calls_peak_mem_bytes`` the peak of the warm-up calls after the first (which compiles, and whose
  figure depends on what Inductor's caches already hold): cudagraph trees' recording and grace's deciding
  call, and the first replays, above the same base;
  ``resident_mem_bytes`` what stays allocated after warm-up (graph pools, static inputs and outputs):
  the memory a mode holds between calls. Both start from no cuBLAS workspace, so a mode that runs
  matmuls counts its own. ``calls_peak_reserved_bytes`` is the peak the caching allocator reserved
  over the same calls, above what it reserved when they started with no cached block left: the
  device memory they held, graph pools whole. Allocated bytes alone understate a mode whose replays
  hand out tensors over pool memory the allocator does not count as allocated (cudagraph trees:
  a replay's outputs, saved tensors and gradients included, leave ``memory_allocated`` unchanged).
- Failures are values (``Failure``), never exceptions escaping to pytest: an OOM or crash in one mode
  does not hide the others.
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grace.compat.torch import clear_cublas_workspaces
from suites import grace_stats
from suites.modes import GRACE_MODES, SPECS, Mode, build, reset_compilers, unavailable_reason
from suites.raw_graph import ReferenceUnavailable
from suites.records import CorrectnessStatus
from suites.tensors import Leaves, clone_inputs, snapshot, to_float64
from suites.training import TrainStep, is_training
from suites.workloads import Workload, WorkloadUnavailable

logger = logging.getLogger(__name__)

WARMUP_CALLS = 3  # compile + record + first replay for cudagraph trees
NO_TRAINING_REFERENCE = "timing references replay one captured forward graph: none exists for a training step"


@dataclass(frozen=True)
class Failure:
    """Why a workload or mode produced no result. ``expected``: the environment lacks something (a
    package, a device, a grace technique), so the test skips instead of failing."""

    status: CorrectnessStatus
    reason: str
    expected: bool = False


def is_oom(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, torch.cuda.OutOfMemoryError) or "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure_of(exc: BaseException, status: CorrectnessStatus = CorrectnessStatus.FAIL_TO_RUN) -> Failure:
    if is_oom(exc):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return Failure(CorrectnessStatus.OOM, describe(exc))
    return Failure(status, describe(exc))


def memory_window_base(device: torch.device) -> int:
    """Open a memory window on CUDA ``device``: peak statistics reset, no cuBLAS workspace held; returns
    the bytes allocated now (the base the window's peak and resident memory are measured above).

    Garbage of earlier work freed inside the window would lower memory_allocated below the base: the
    window's peak would read too low (down to 0) and its resident memory negative. cuBLAS's workspaces
    (about 33 MiB each on the H200) are such memory: cudagraph trees free them before recording (pt2cg
    read 0 MiB, resident -66 MiB, on the 2026-11-29 H200 runs) and the next mode to run a matmul
    allocates them again. So every window starts without them and pays its own."""
    gc.collect()
    torch.cuda.synchronize(device)
    clear_cublas_workspaces()
    torch.cuda.empty_cache()  # reserved memory starts from what is in use (calls_peak_reserved_bytes)
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_counters() -> dict[str, int]:
    """Dynamo/Inductor counters worth keeping per mode: graphs made, graph breaks, cudagraph skips."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {
        "dynamo_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
    }


@dataclass
class CompiledMode:
    mode: Mode
    fn: Callable[..., Any] | None = None
    inputs: tuple[Any, ...] = ()
    compile_s: float | None = None
    peak_mem_bytes: int | None = None
    calls_peak_mem_bytes: int | None = None
    resident_mem_bytes: int | None = None
    calls_peak_reserved_bytes: int | None = None
    failure: Failure | None = None
    grace_keys: frozenset[str] = frozenset()  # grace.stats graphs created by this mode
    compile_facts: dict[str, int] = field(default_factory=dict)  # Dynamo/Inductor counter deltas


@dataclass
class PreparedWorkload:
    workload: Workload
    tier: str
    device: torch.device
    dtype: torch.dtype
    model: Any = None
    inputs: tuple[Any, ...] = ()
    load_failure: Failure | None = None
    compiled: dict[Mode, CompiledMode] = field(default_factory=dict)
    diagnosed: bool = False
    _eager: tuple[Leaves, Leaves] | Failure | None = None
    _fp64: Leaves | str | None = None
    training_cache: dict[str, Any] = field(default_factory=dict)  # suites.correctness's training references

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.workload.name, self.tier, str(self.device), str(self.dtype))

    def load(self) -> None:
        try:
            with torch.no_grad():
                self.model, self.inputs = self.workload.factory(self.tier)(self.device, self.dtype)
        except WorkloadUnavailable as exc:
            status = CorrectnessStatus.MODEL_FAIL_TO_LOAD if exc.installed else CorrectnessStatus.SKIP
            self.load_failure = Failure(status, str(exc), expected=True)
        except Exception as exc:
            failure = failure_of(exc, CorrectnessStatus.MODEL_FAIL_TO_LOAD)
            self.load_failure = failure
            logger.warning("%s failed to load: %s", self.workload.name, failure.reason)

    def run(self, fn: Callable[..., Any], inputs: tuple[Any, ...]) -> Leaves:
        """Call ``fn`` and snapshot what it produced (and the inputs it writes, for mutating workloads)."""
        with torch.no_grad():
            out = snapshot(fn(*inputs))
            if self.workload.mutates_inputs:
                out += [(f"inputs.{path}", t) for path, t in snapshot(inputs)]
        return out

    def eager(self) -> tuple[Leaves, Leaves] | Failure:
        """Two eager runs on separate copies of the inputs (or why eager failed)."""
        if self._eager is None:
            try:
                first = self.run(self.model, clone_inputs(self.inputs))
                second = self.run(self.model, clone_inputs(self.inputs))
                self._eager = (first, second)
            except Exception as exc:
                self._eager = failure_of(exc, CorrectnessStatus.EAGER_FAIL_TO_RUN)
        return self._eager

    def fp64(self) -> Leaves | str:
        """The float64 reference outputs, or the reason there is none (tried on the device, then CPU)."""
        if self._fp64 is None:
            reasons = []
            for device in (None, torch.device("cpu")) if self.device.type != "cpu" else (None,):
                model64 = None
                try:
                    model64 = copy.deepcopy(self.model)
                    model64 = model64.to(device=device, dtype=torch.float64) if device else model64.double()
                    self._fp64 = self.run(model64, to_float64(clone_inputs(self.inputs), device))
                    break
                except Exception as exc:
                    reasons.append(f"on {device or self.device}: {describe(exc, 300)}")
                finally:
                    del model64
                    gc.collect()
            else:
                self._fp64 = "no float64 reference: " + "; ".join(reasons)
        return self._fp64

    def compiled_mode(self, mode: Mode) -> CompiledMode:
        """``mode`` compiled and warmed up on its own copy of model and inputs (once per workload)."""
        if mode in self.compiled:
            return self.compiled[mode]
        entry = CompiledMode(mode)
        self.compiled[mode] = entry
        training = is_training(self.workload)
        reason = unavailable_reason(mode, self.device.type)
        if reason is None and training and SPECS[mode].timing_reference:
            reason = NO_TRAINING_REFERENCE
        if reason is not None:
            entry.failure = Failure(CorrectnessStatus.SKIP, reason, expected=True)
            return entry
        before = grace_stats.graph_keys() if mode in GRACE_MODES else None
        counters_before = compile_counters()
        try:
            # a training step changes its model: every mode, eager included, trains its own copy
            model = self.model if mode is Mode.EAGER and not training else copy.deepcopy(self.model)
            entry.inputs = clone_inputs(self.inputs)
            synchronize(self.device)
            base = self._reset_peak()
            reserved_base = int(torch.cuda.memory_reserved(self.device)) if base is not None else None
            t0 = time.perf_counter()
            entry.fn = TrainStep(mode, model, self.device.type) if training else build(mode, model)
            with torch.no_grad():
                entry.fn(*entry.inputs)
                synchronize(self.device)
                entry.compile_s = time.perf_counter() - t0
                compile_peak = self._peak_since_reset() if base is not None else None
                for _ in range(WARMUP_CALLS - 1):
                    entry.fn(*entry.inputs)
            synchronize(self.device)
            if base is not None and compile_peak is not None:
                calls_peak = int(torch.cuda.max_memory_allocated(self.device))
                entry.peak_mem_bytes = max(compile_peak, calls_peak) - base
                entry.calls_peak_mem_bytes = calls_peak - base
                entry.resident_mem_bytes = int(torch.cuda.memory_allocated(self.device) - base)
                if reserved_base is not None:
                    reserved_peak = int(torch.cuda.max_memory_reserved(self.device))
                    entry.calls_peak_reserved_bytes = reserved_peak - reserved_base
        except ReferenceUnavailable as exc:  # a timing reference that cannot exist here: a skip
            entry.failure = Failure(CorrectnessStatus.SKIP, str(exc), expected=True)
            entry.fn = None
        except Exception as exc:
            entry.failure = failure_of(exc)
            entry.fn = None
            logger.warning("%s/%s failed: %s", self.workload.name, mode.value, entry.failure.reason)
        if before is not None:
            entry.grace_keys = frozenset(grace_stats.graph_keys() - before)
        after = compile_counters()
        entry.compile_facts = {
            k: v - counters_before.get(k, 0) for k, v in after.items() if v != counters_before.get(k, 0)
        }
        return entry

    def _reset_peak(self) -> int | None:
        return memory_window_base(self.device) if self.device.type == "cuda" else None

    def _peak_since_reset(self) -> int:
        """The peak allocated since the window opened; the peak statistics start again from now, after
        the cached free blocks went back to the device, so that the next calls' reserved peak counts what
        they hold, not what compiling left cached."""
        peak = int(torch.cuda.max_memory_allocated(self.device))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def close(self) -> None:
        self.compiled.clear()
        self.model = None
        self.inputs = ()
        self._eager = self._fp64 = None
        self.training_cache.clear()
        try:
            reset_compilers()
        except Exception as exc:  # a broken reset must not fail the next workload's tests
            logger.warning("resetting compilers after %s failed: %s", self.workload.name, describe(exc))
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


_CURRENT: list[PreparedWorkload] = []


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def prepare(
    wl: Workload, tier: str, device: torch.device, dtype: torch.dtype = torch.float32
) -> PreparedWorkload:
    """The process's prepared ``wl`` (built on first use; the previous workload is closed)."""
    key = (wl.name, tier, str(device), str(dtype))
    if _CURRENT and _CURRENT[0].key == key:
        return _CURRENT[0]
    release()
    prepared = PreparedWorkload(wl, tier, device, dtype)
    prepared.load()
    _CURRENT.append(prepared)
    return prepared


def release() -> None:
    while _CURRENT:
        _CURRENT.pop().close()


def mode_uses_graphs(mode: Mode) -> bool:
    return SPECS[mode].uses_graphs
