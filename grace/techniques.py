"""Which GraCE techniques can run here, and if not, why.

Problem: users, the suites and the matrix must know before running whether the runtime, CGCT, PI and
SCG are usable on this machine and build, with a reason that tells them what is missing.

Design: ``available()`` probes each technique without compiling anything: torch and a CUDA device for
the runtime and SCG (timing needs CUDA events), the CGCT package's ``transform``, the PI package's
``prepare`` plus cuda-bindings and a CUDA device. Values are None (usable) or the reason.
"""

from __future__ import annotations

import importlib.util


def available() -> dict[str, str | None]:
    if importlib.util.find_spec("torch") is None:
        reason = "torch is not installed"
        return {"runtime": reason, "cgct": reason, "pi": reason, "scg": reason}

    from grace.compat import cuda as cuda_compat
    from grace.compat import torch as torch_compat
    from grace.seams import load_seam

    no_cuda = None if torch_compat.cuda_available() else "no CUDA device"
    _, cgct_reason = load_seam("cgct", "transform")
    _, pi_reason = load_seam("pi", "prepare")
    pi: str | None
    if pi_reason is not None:
        pi = pi_reason.detail
    elif cuda_compat.driver() is None:
        pi = f"cuda-bindings not available: {cuda_compat.import_error()}"
    else:
        pi = no_cuda
    return {
        "runtime": no_cuda,
        "cgct": cgct_reason.detail if cgct_reason is not None else None,
        "pi": pi,
        "scg": no_cuda,
    }
