"""Small CUDA C++ kernels of parameter indirection, compiled with NVRTC and loaded into the driver.

Problem: PI adds kernels of its own to captured graphs (the vendor prelude, the table fill node). They
are compiled on the user's machine for its GPU, with whatever NVRTC the cuda-bindings install brings,
and loaded by a driver that may be older than that NVRTC: the PTX's ``.version`` can then be newer than
the driver reads, although the kernels use nothing recent.

Design: ``compile_ptx`` runs NVRTC for ``compute_<capability>`` with the caller's extra options and
returns the PTX (the compile log in the error when NVRTC rejects the source). ``load_ptx`` loads the PTX
with ``grace.pi.driver.load_kernel``; when the driver refuses it, it retries once with ``.version``
lowered to the newest PTX ISA the driver release reads (``PTX_ISA_OF_DRIVER``). Callers cache the
loaded function per device and variant.

Invariant: every failure raises ``NvrtcError`` saying which step failed; nothing here imports
cuda-bindings' NVRTC before a compile is asked for.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Sequence
from typing import Any

# Newest PTX ISA each CUDA driver release reads (CUDA's PTX release notes): an NVRTC newer than the
# driver emits a .version the driver rejects; PI's kernels use nothing newer than 8.4.
PTX_ISA_OF_DRIVER = (
    (13020, "9.2"),
    (13010, "9.1"),
    (13000, "9.0"),
    (12090, "8.8"),
    (12080, "8.7"),
    (12060, "8.5"),
    (12050, "8.5"),
    (12040, "8.4"),
)


class NvrtcError(RuntimeError):
    """NVRTC is missing, rejected a source, or the driver refused its PTX."""


@functools.cache
def bindings() -> Any:
    """cuda-bindings' NVRTC module (``cuda.bindings.nvrtc``, or ``cuda.nvrtc`` before 12.6)."""
    errors = []
    for name in ("cuda.bindings.nvrtc", "cuda.nvrtc"):
        try:
            return importlib.import_module(name)
        except Exception as exc:
            errors.append(f"{name}: {exc}")
    raise NvrtcError("NVRTC bindings unavailable: " + "; ".join(errors))


def _check(name: str, result: Any) -> Any:
    nvrtc = bindings()
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != int(nvrtc.nvrtcResult.NVRTC_SUCCESS):
        raise NvrtcError(f"{name} failed: {err}")
    return values[0] if len(values) == 1 else values


def compile_ptx(source: str, filename: str, capability: int, options: Sequence[str] = ()) -> bytes:
    """PTX of ``source`` for ``compute_<capability>`` (``options`` are extra NVRTC flags)."""
    nvrtc = bindings()
    program = _check(
        "nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    )
    try:
        flags = [f"--gpu-architecture=compute_{capability}".encode(), *(o.encode() for o in options)]
        result = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        if int(result[0]) != int(nvrtc.nvrtcResult.NVRTC_SUCCESS):
            size = _check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(program))
            log = b" " * size
            _check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(program, log))
            raise NvrtcError(f"NVRTC rejected {filename}: {log.decode(errors='replace').strip()}")
        size = _check("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(program))
        ptx = b" " * size
        _check("nvrtcGetPTX", nvrtc.nvrtcGetPTX(program, ptx))
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return ptx


def lower_ptx_version(ptx: bytes, driver_version: int | None) -> bytes | None:
    """``ptx`` with ``.version`` set to the newest ISA ``driver_version`` reads (None: unknown or same)."""
    isa = next(
        (v for release, v in PTX_ISA_OF_DRIVER if driver_version is not None and driver_version >= release),
        None,
    )
    if isa is None:
        return None
    text = ptx.decode()
    lowered = re.sub(r"^\.version\s+\d+\.\d+", f".version {isa}", text, count=1, flags=re.MULTILINE)
    return lowered.encode() if lowered != text else None


def load_ptx(ptx: bytes, name: str) -> int:
    """The ``CUfunction`` ``name`` of ``ptx`` loaded into the current context (retrying with a lower
    ``.version`` when the driver refuses the PTX as NVRTC wrote it)."""
    from grace.compat import cuda as cuda_compat
    from grace.pi import driver

    try:
        return driver.load_kernel(ptx, name).function
    except Exception as exc:
        lowered = lower_ptx_version(ptx, cuda_compat.driver_version())
        if lowered is None:
            raise NvrtcError(f"loading {name}: {type(exc).__name__}: {exc}") from exc
        try:
            return driver.load_kernel(lowered, name).function
        except Exception as again:
            raise NvrtcError(
                f"loading {name}: {type(exc).__name__}: {exc}; with an older .version: {again}"
            ) from again
