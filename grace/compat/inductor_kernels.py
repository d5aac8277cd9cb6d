"""The Triton kernels an Inductor module holds: their ``CUfunction``, PTX and signature, per release.

Problem: parameter indirection (grace.pi.triton) must find, for every kernel node of a captured graph,
the Triton kernel Inductor compiled for it, with its PTX and its argument list. Where they live changed
between torch releases: 2.4-2.6 launchers close over the ``CompiledKernel`` as ``bin``; 2.7 keeps
``compile_results[i].kernel``; from 2.8 the default static launcher keeps no asm, and the PTX is read
from the Triton cache directory (whose key encoding differs between Triton releases) next to the
cubin. Arguments specialised as equal to 1 are named by 3.0-3.2 descriptors only.

Design: ``locate_inductor_kernels`` reads the module globals that are ``CachingAutotuner`` objects and
returns one ``LocatedKernel`` per compiled kernel, with ``ptx_source`` saying where the PTX came from.
Every release difference is handled here, by duck typing on the objects Inductor hands out; nothing
outside ``grace.compat`` reads Inductor's or Triton's private attributes.

Invariants:
- A kernel whose PTX cannot be found is still returned (``ptx`` None, ``ptx_source`` empty), so the
  caller can report why it was not rewritten instead of missing it.
- ``function`` is the ``CUfunction`` the captured kernel node launches, or 0 when it is not loaded.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LocatedKernel:
    """A Triton kernel held by an Inductor ``CachingAutotuner``: its CUfunction, PTX and signature."""

    autotuner: str
    name: str
    function: int
    ptx: str | None
    arg_names: tuple[str, ...]
    signature: dict[str, str]
    shared: int
    num_warps: int
    enable_fp_fusion: bool
    equal_to_1: tuple[str, ...]
    ptx_source: str  # where the PTX came from: "asm", "cache" or "" when none was found


def _compiled_kernels(autotuner: Any) -> list[Any]:
    """The ``CompiledKernel``-like objects behind an autotuner's launchers, across torch releases."""
    found: list[Any] = []
    for launcher in getattr(autotuner, "launchers", None) or []:
        globals_ = getattr(launcher, "__globals__", {})
        if "bin" in globals_:  # torch 2.4-2.6: launchers close over the CompiledKernel as `bin`
            found.append(globals_["bin"])
            continue
        for attr in ("bin", "kernel"):
            if hasattr(launcher, attr):
                found.append(getattr(launcher, attr))
                break
    for result in getattr(autotuner, "compile_results", None) or []:  # torch 2.7+
        kernel = getattr(result, "kernel", None)
        if kernel is not None and all(kernel is not k for k in found):
            found.append(kernel)
    return found


def _kernel_ptx(kernel: Any) -> tuple[str | None, str]:
    """PTX of a compiled kernel: its ``asm`` (a Triton ``CompiledKernel``), else the Triton cache.

    Inductor's static launcher (torch 2.8+) keeps neither asm nor, once loaded, its cubin path; the
    Triton cache directory still holds ``<name>.ptx`` next to the cubin, under the kernel's hash.
    """
    asm = getattr(kernel, "asm", None)
    if isinstance(asm, Mapping) and asm.get("ptx"):
        return str(asm["ptx"]), "asm"
    name = getattr(kernel, "name", None) or getattr(getattr(kernel, "metadata", None), "name", None)
    for path in _cache_candidates(kernel, name):
        if path.is_file():
            return path.read_text(), "cache"
    return None, ""


def _cache_candidates(kernel: Any, name: str | None) -> list[Path]:
    candidates: list[Path] = []
    for attr in ("cubin_path", "_cubin_path"):
        value = getattr(kernel, attr, None)
        if value:
            candidates.append(Path(str(value)).with_suffix(".ptx"))
    digest = getattr(kernel, "hash", None)
    if not digest or not name:
        return candidates
    keys = [str(digest)]
    for encoder in ("_base32", "_base64"):  # the cache key encodings of successive Triton releases
        try:
            import triton.runtime.cache as triton_cache

            keys.insert(0, getattr(triton_cache, encoder)(str(digest)))
        except Exception:
            continue
    roots: list[Path] = []
    if os.environ.get("TRITON_CACHE_DIR"):
        roots.append(Path(os.environ["TRITON_CACHE_DIR"]))
    try:  # where Inductor points Triton's cache (torch 2.8+)
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        device = getattr(kernel, "device", None)
        for index in dict.fromkeys([device if isinstance(device, int) else 0, 0]):
            roots.append(Path(triton_cache_dir(index)))
    except Exception:
        pass
    roots.append(Path.home() / ".triton" / "cache")
    for root in dict.fromkeys(roots):
        for key in keys:
            candidates.append(root / key / f"{name}.ptx")
    return candidates


def _function_handle(kernel: Any) -> int:
    for attr in ("function", "cu_function"):
        value = getattr(kernel, attr, None)
        if value:
            return int(value)
    return 0


def _field(meta: Any, key: str, default: Any = None) -> Any:
    if isinstance(meta, Mapping):
        return meta.get(key, default)
    return getattr(meta, key, default)


def locate_inductor_kernels(module_globals: Mapping[str, Any]) -> list[LocatedKernel]:
    """Every compiled Triton kernel held by a ``CachingAutotuner`` among an Inductor module's globals."""
    located: list[LocatedKernel] = []
    for gname, value in module_globals.items():
        if type(value).__name__ != "CachingAutotuner":
            continue
        fn = getattr(value, "fn", None)
        arg_names = tuple(getattr(fn, "arg_names", ()) or ())
        triton_meta = getattr(value, "triton_meta", {}) or {}
        signature = dict(triton_meta.get("signature", {}))
        equal_to_1 = tuple(_equal_to_1_names(triton_meta, arg_names))
        for kernel in _compiled_kernels(value):
            ptx, source = _kernel_ptx(kernel)
            meta = getattr(kernel, "metadata", {})
            located.append(
                LocatedKernel(
                    autotuner=gname,
                    name=str(_field(meta, "name", getattr(fn, "__name__", gname))),
                    function=_function_handle(kernel),
                    ptx=ptx,
                    arg_names=arg_names,
                    signature=signature,
                    shared=int(getattr(kernel, "shared", None) or _field(meta, "shared", 0) or 0),
                    num_warps=int(getattr(kernel, "num_warps", None) or _field(meta, "num_warps", 4) or 4),
                    enable_fp_fusion=bool(_field(meta, "enable_fp_fusion", True)),
                    equal_to_1=equal_to_1,
                    ptx_source=source,
                )
            )
    return located


def _equal_to_1_names(triton_meta: Mapping[str, Any], arg_names: tuple[str, ...]) -> list[str]:
    """Arguments an Inductor kernel specialised as 1 (3.0-3.2 descriptors; 3.3+ puts them in constants)."""
    names: list[str] = []
    for config in triton_meta.get("configs", ()) or ():
        indices: Collection[int] = ()
        if dataclasses.is_dataclass(config) and hasattr(config, "equal_to_1"):
            indices = config.equal_to_1
        elif hasattr(config, "arg_properties"):
            indices = config.arg_properties.get("tt.equal_to", ())
        names.extend(arg_names[i] for i in indices if isinstance(i, int) and i < len(arg_names))
    return names
