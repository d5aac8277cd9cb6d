"""Why grace declined a technique: one enum of codes plus a free-text detail.

Problem: every grace variant must fall back to a safe path and say why, never silently. The reasons
travel from the place that declines (capture, PI, CGCT, SCG) to logs, stats, ``grace.explain`` and the
matrix store, so they must be stable, comparable and serialisable.

Design: ``SkipCode`` is a ``str`` enum (its value is what stores and dashboards keep); ``SkipReason`` is a
frozen pair (code, detail). ``log_once`` logs a reason the first time its (code, detail, where) is seen in
the process, so a model called a million times logs a fallback once.

Invariant: codes are only ever added, never renamed: stored results refer to them by value.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class SkipCode(str, enum.Enum):
    """Stable codes for declined graphs and techniques (values are stored; never rename)."""

    # environment
    NO_CUDA = "no_cuda"
    CUDA_BINDINGS_MISSING = "cuda_bindings_missing"
    DISABLED_BY_OPTION = "disabled_by_option"
    # what the compiled graph contains
    CPU_INPUT = "cpu_input"
    CPU_OP = "cpu_op"
    CPU_OUTPUT = "cpu_output"
    MULTIPLE_DEVICES = "multiple_devices"
    COLLECTIVES = "collectives"
    NO_CUDA_TENSORS = "no_cuda_tensors"
    AUTOGRAD = "autograd"
    UNSUPPORTED_INPUT = "unsupported_input"
    UNSUPPORTED_OUTPUT_ALIAS = "unsupported_output_alias"
    MUTATION_UNKNOWN = "mutation_unknown"  # which inputs the graph writes could not be established
    RANDOM_STATE_UNKNOWN = "random_state_unknown"  # the generators' state cannot be saved and restored
    UNLISTED_WRITE = "unlisted_write"  # a run wrote inputs the analysis did not list: written from then on
    # runtime failures
    CAPTURE_FAILED = "capture_failed"
    INSTANTIATE_FAILED = "instantiate_failed"
    REPLAY_FAILED = "replay_failed"
    NUMERIC_MISMATCH = "numeric_mismatch"
    NUMERIC_NOISE = "numeric_noise"  # the no-graph callable itself differs between runs: its spread allowed
    STATIC_INPUT_MOVED = "static_input_moved"
    TOO_MANY_RECAPTURES = "too_many_recaptures"
    REBIND_DECLINED = "rebind_declined"  # the graph could not follow moved static inputs: re-captured
    OUTPUTS_HELD = "outputs_held"  # a replay within one compiled call would overwrite held outputs
    POOL_OF_ITS_OWN = "pool_of_its_own"  # a capture kept out of a shared pool a lent output still needs
    # grace's own failures (Note: [The backend never raises for its own failures] in grace.backend)
    BACKEND_FAILED = "backend_failed"  # grace's code raised while compiling: that part was left out
    RUNNER_FAILED = "runner_failed"  # grace's code raised during a call: the safe path from then on
    # selective CUDA graphs
    SCG_SLOWER = "scg_slower"
    # CGCT seam
    CGCT_UNAVAILABLE = "cgct_unavailable"
    CGCT_FAILED = "cgct_failed"
    # parameter indirection seam (the PI package may return any of these from ``prepare``)
    PI_UNAVAILABLE = "pi_unavailable"
    PI_FAILED = "pi_failed"
    PI_NO_KERNELS = "pi_no_kernels"
    PI_UNSUPPORTED_NODE = "pi_unsupported_node"
    PI_REWRITE_FAILED = "pi_rewrite_failed"
    PI_PATCH_FAILED = "pi_patch_failed"
    PI_ALIGNMENT = "pi_alignment"
    PI_NO_DYNAMIC_INPUTS = "pi_no_dynamic_inputs"
    PI_DIRECT_DECLINED = "pi_direct_declined"  # option pi_direct: the PI graph needs placeholders after all


@dataclass(frozen=True)
class SkipReason:
    """A declined technique: ``code`` for machines, ``detail`` for people."""

    code: SkipCode
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.code.value}: {self.detail}" if self.detail else self.code.value

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "detail": self.detail}


_seen: set[tuple[str, str, str]] = set()
_seen_lock = threading.Lock()


def log_once(reason: SkipReason, where: str, level: int = logging.INFO) -> None:
    """Log ``reason`` the first time it is seen for ``where`` in this process."""
    key = (reason.code.value, reason.detail, where)
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.log(level, "grace: %s: no CUDA graph (%s)", where, reason)


def reset_logged() -> None:
    """Forget which reasons were logged (``grace.reset`` and tests)."""
    with _seen_lock:
        _seen.clear()
