"""Triton version differences: compiling for a target without a GPU, its bundled tools, kernel loading.

Problem: parameter indirection (grace.pi) needs, for every Triton release from 3.0 to 3.9, the PTX of a
kernel compiled for a given GPU target, that release's own ptxas and cuobjdump, and a way to load a
cubin. Each of those moved between releases: ``ASTSource`` took ``{name: type}`` signatures with an
``AttrsDescriptor`` (3.0-3.1: a dataclass of index sets; 3.2: ``from_dict`` of property lists) and
later ``{name: type}`` with constexpr entries and ``{(index,): [[attr, value]]}`` attributes (3.3+);
ptxas is found through ``_path_to_binary`` (3.0-3.2), ``get_ptxas(arch)`` returning a tuple (3.3),
``get_ptxas()`` or ``get_ptxas(arch)`` returning a tool object (3.4+), and 3.9 assembles sm_90 with
``ptxas-blackwell`` (its PTX is ``.version 9.4``, which the plain ptxas rejects); ``load_binary`` returns
four values up to 3.4 and five after. Triton writes the newest ``.version`` its ptxas reads, and
Inductor points Triton at the ptxas torch ships (``grace.compat.torch.inductor_worker_ptxas``; CUDA 13
builds of torch 2.11 ship a 13.0 ptxas next to Triton 3.6's 12.8), so a kernel Inductor compiled (or
loaded from its cache) can carry a ``.version`` (9.0) that this process's Triton ptxas rejects:
``ptxas_reading`` picks a ptxas that reads it.

Design: every difference is probed here once, against the installed Triton, and exposed as a
capability or a function with one signature. Nothing here imports Triton at module import time, so
``import grace`` stays cheap and works where Triton is absent (``HAS_TRITON`` is False then). The
kernels Inductor compiled are found by ``grace.compat.inductor_kernels``.

Invariants:
- ``compile_for_target`` never touches a GPU or a driver; it works on a machine without one.
- ``ptxas_for`` names the ptxas that this Triton itself would use for the target, so a rewritten
  kernel is assembled by the same tool as the original; ``ptxas_reading`` departs from it only when
  that tool cannot read the PTX's ``.version`` and the worker's ptxas can.
- The parameter list of the PTX entry is: the non-constexpr arguments (3.0-3.2 also drop arguments
  specialised as equal to 1), then the trailing scratch parameters that ``scratch_parameters`` names.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

logger = logging.getLogger(__name__)

HAS_TRITON: bool = importlib.util.find_spec("triton") is not None

# Names Triton gives the trailing pointer parameters it appends after the kernel's own arguments, in
# the order they appear in the PTX entry (read from each release's compiler; DESIGN.md 3.3).
GLOBAL_SCRATCH = "global_scratch"
PROFILE_SCRATCH = "profile_scratch"


class TritonUnavailable(RuntimeError):
    """Triton is not installed, or this release lacks what the caller asked for."""


@functools.cache
def triton_version() -> Version | None:
    """The installed Triton release, or None when Triton is absent."""
    if not HAS_TRITON:
        return None
    import triton

    return Version(triton.__version__.split("+")[0])


def _require() -> Version:
    version = triton_version()
    if version is None:
        raise TritonUnavailable("Triton is not installed; install the cell's triton package")
    return version


@functools.cache
def scratch_parameters() -> tuple[str, ...]:
    """Names of the pointer parameters Triton appends to every kernel entry, in PTX order.

    The count is probed by compiling a one-pointer kernel for sm_90 (no GPU needed); names follow
    the order Triton appends them in (global scratch first, then profile scratch).
    """
    _require()
    artifacts = compile_for_target(_probe_kernel(), {"x_ptr": "*fp32"}, {}, divisible_by_16={"x_ptr"})
    count = len(re.findall(r"\.param\s", _entry_header(artifacts.ptx))) - 1
    names = (GLOBAL_SCRATCH, PROFILE_SCRATCH)
    if count > len(names):
        raise TritonUnavailable(
            f"Triton {triton_version()} appends {count} parameters to a kernel entry; this grace knows "
            f"{len(names)} ({', '.join(names)}). Upgrade grace or pin an older Triton."
        )
    return names[:count]


def _entry_header(ptx: str) -> str:
    match = re.search(r"\.entry\s+[\w$]+\s*\((.*?)\)", ptx, re.DOTALL)
    return match.group(1) if match else ""


@functools.cache
def _probe_kernel() -> Any:
    from grace.compat._triton_probe import grace_scratch_probe

    return grace_scratch_probe


@dataclass(frozen=True)
class CompiledArtifacts:
    """What a compile for a target produced: the entry name, PTX text, cubin bytes and options."""

    name: str
    ptx: str
    cubin: bytes
    num_warps: int
    shared: int
    enable_fp_fusion: bool
    capability: int


def compile_for_target(
    fn: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    *,
    divisible_by_16: Collection[str] = (),
    equal_to_1: Collection[str] = (),
    capability: int = 90,
    warp_size: int = 32,
    num_warps: int = 4,
    num_stages: int = 3,
    enable_fp_fusion: bool = True,
) -> CompiledArtifacts:
    """Compile a ``triton.jit`` function for ``cuda:capability`` without a GPU.

    ``signature`` maps every argument name, in order, to a Triton type string (``*fp32``, ``i32``,
    ``constexpr``). ``constexprs`` gives the values of constexpr arguments. ``equal_to_1`` names integer
    arguments specialised as 1 (they leave the PTX entry); ``divisible_by_16`` names arguments
    specialised as 16-divisible (pointers then carry that alignment assumption).
    """
    version = _require()
    import triton
    from triton.backends.compiler import GPUTarget

    arg_names = list(fn.arg_names)
    if list(signature) != arg_names:
        raise ValueError(f"signature keys {list(signature)} do not match {fn.__name__}'s args {arg_names}")
    index = {name: i for i, name in enumerate(arg_names)}
    options = {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": enable_fp_fusion}
    if version < Version("3.3"):
        sig = {n: t for n, t in signature.items() if t != "constexpr"}
        constants: dict[str, Any] = {n: constexprs[n] for n, t in signature.items() if t == "constexpr"}
        constants.update({n: 1 for n in equal_to_1})
        div = sorted(index[n] for n in divisible_by_16)
        one = sorted(index[n] for n in equal_to_1)
        if version < Version("3.2"):
            from triton.compiler.compiler import AttrsDescriptor

            attrs: Any = AttrsDescriptor(divisible_by_16=set(div), equal_to_1=set(one))
        else:
            from triton.backends.compiler import AttrsDescriptor

            attrs = AttrsDescriptor.from_dict(
                {"arg_properties": {"tt.divisibility": div, "tt.equal_to": one}, "cls": "AttrsDescriptor"}
            )
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constants=constants, attrs=attrs)
    else:
        sig = dict(signature)
        values = dict(constexprs)
        for n in equal_to_1:
            sig[n] = "constexpr"
            values[n] = 1
        attrs = {(index[n],): [["tt.divisibility", 16]] for n in divisible_by_16}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=values, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", capability, warp_size), options=options)
    meta = kernel.metadata
    meta_get = meta.get if isinstance(meta, dict) else lambda k, d=None: getattr(meta, k, d)
    return CompiledArtifacts(
        name=str(meta_get("name", fn.__name__)),
        ptx=kernel.asm["ptx"],
        cubin=bytes(kernel.asm["cubin"]),
        num_warps=int(meta_get("num_warps", num_warps)),
        shared=int(meta_get("shared", 0)),
        enable_fp_fusion=bool(meta_get("enable_fp_fusion", enable_fp_fusion)),
        capability=capability,
    )


@dataclass(frozen=True)
class Tool:
    """A CUDA tool bundled with Triton: its path and release (``12.8``)."""

    path: Path
    release: str


@functools.cache
def _tool(path: str | os.PathLike[str]) -> Tool:
    """The tool at ``path`` with its release (asked once per path: a build may ask for every kernel)."""
    out = subprocess.run([os.fspath(path), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    if match is None:
        raise TritonUnavailable(f"{path} --version printed no release: {out!r}")
    return Tool(Path(path), match.group(1))


def _nvidia_compiler_module() -> Any:
    _require()
    import triton.backends.nvidia.compiler as nvc

    return nvc


@functools.cache
def ptxas_for(capability: int = 90) -> Tool:
    """The ptxas this Triton uses for ``sm_<capability>``."""
    nvc = _nvidia_compiler_module()
    get_ptxas = getattr(nvc, "get_ptxas", None)
    if get_ptxas is not None:
        params = inspect.signature(get_ptxas).parameters
        found = get_ptxas(capability) if params else get_ptxas()
        path = found[0] if isinstance(found, tuple) else found.path
    else:
        path, _ = nvc._path_to_binary("ptxas")
    return _tool(path)


@functools.cache
def cuobjdump() -> Tool:
    """The cuobjdump bundled with this Triton (or named by ``TRITON_CUOBJDUMP_PATH``)."""
    _require()
    import triton.backends.nvidia as nv

    override = os.environ.get("TRITON_CUOBJDUMP_PATH")
    path = Path(override) if override else Path(nv.__file__).parent / "bin" / "cuobjdump"
    return _tool(path)


def ptx_isa(ptx: str) -> int | None:
    """The PTX ISA a module declares (``.version 9.0`` -> 90), or None without the directive."""
    match = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.MULTILINE)
    return None if match is None else int(match.group(1)) * 10 + int(match.group(2))


def isa_of_ptxas(release: str) -> int:
    """The newest PTX ISA that ptxas ``release`` (``12.8``) reads: Triton's own mapping where it has one
    (``ptx_get_version``), else the CUDA release notes' (12.0-12.5 -> 8.0-8.5, 12.6+ -> minor - 1 + 80,
    13.x -> 9.x)."""
    nvc = _nvidia_compiler_module()
    mapping = getattr(nvc, "ptx_get_version", None)
    if mapping is not None:
        return int(mapping(release))
    major, minor = (int(part) for part in release.split(".")[:2])
    if major >= 13:
        return 90 + (major - 13) * 10 + minor
    return 80 + minor - (1 if minor >= 6 else 0) if major == 12 else 70 + minor


def ptxas_reading(ptx: str, capability: int = 90) -> Tool:
    """The ptxas to assemble ``ptx`` with: this Triton's (``ptxas_for``) unless it cannot read the
    PTX's ``.version`` and the ptxas Inductor's compile workers use can."""
    own = ptxas_for(capability)
    wanted = ptx_isa(ptx)
    if wanted is None or wanted <= isa_of_ptxas(own.release):
        return own
    worker = _inductor_worker_ptxas()
    if worker is None or Path(worker) == own.path:
        return own
    tool = _tool(worker)
    return tool if wanted <= isa_of_ptxas(tool.release) else own


def _inductor_worker_ptxas() -> str | None:
    """``grace.compat.torch.inductor_worker_ptxas`` where torch is installed; where it is not (a
    Triton-only environment) there is no Inductor, so only ``TRITON_PTXAS_PATH`` can name another
    ptxas, and torch is never imported."""
    try:
        has_torch = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        has_torch = False
    if not has_torch:
        return os.environ.get("TRITON_PTXAS_PATH") or None
    from grace.compat import torch as torch_compat

    return torch_compat.inductor_worker_ptxas()


# Triton reads its ptxas from these variables at each assembly (3.0+); ``ptxas-blackwell`` serves sm_100+
# from 3.3 and every target from 3.9, so an override names the tool under both.
_PTXAS_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")


@contextlib.contextmanager
def _ptxas_override(tool: Tool | None, capability: int) -> Iterator[None]:
    if tool is None or tool.path == ptxas_for(capability).path:
        yield
        return
    saved = {name: os.environ.get(name) for name in _PTXAS_VARIABLES}
    os.environ.update({name: os.fspath(tool.path) for name in _PTXAS_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class ToolError(RuntimeError):
    """A bundled CUDA tool (ptxas, cuobjdump) failed; ``log`` holds what it printed."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n{log}")
        self.log = log


def ptx_target(ptx: str) -> str:
    """The ``.target`` of a PTX module (``sm_90a``)."""
    match = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    if match is None:
        raise ValueError("PTX has no .target directive")
    return match.group(1)


def assemble(
    ptx: str,
    *,
    capability: int = 90,
    num_warps: int = 4,
    enable_fp_fusion: bool = True,
    ptxas: Tool | None = None,
) -> bytes:
    """Assemble PTX to a cubin the way this Triton assembles its own kernels.

    Goes through the NVIDIA backend's ``make_cubin`` so the rewritten kernel gets the same ptxas, the
    same flags and the same workarounds as the original (3.9, for instance, adds
    ``--regAllocOptLevel=2``); ``ptxas`` (from ``ptxas_reading``) replaces Triton's tool for this call
    only. Raises ``ToolError`` with ptxas's log when it rejects the PTX.
    """
    _require()
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", capability, 32))
    options = backend.parse_options({"num_warps": num_warps, "enable_fp_fusion": enable_fp_fusion})
    metadata: dict[str, Any] = {}
    release = (ptxas or ptxas_for(capability)).release
    try:
        with _ptxas_override(ptxas, capability):
            return bytes(backend.make_cubin(ptx, metadata, options, capability))
    except (
        Exception
    ) as exc:  # RuntimeError up to 3.2, PTXASError (a TritonError) from 3.3; both carry the log
        raise ToolError(f"ptxas {release} rejected the PTX", str(exc)) from exc


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin, from this Triton's cuobjdump."""
    tool = cuobjdump()
    with tempfile.TemporaryDirectory(prefix="grace-cuobjdump-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(
            [os.fspath(tool.path), "-sass", os.fspath(path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise ToolError(f"cuobjdump {tool.release} exited with {done.returncode}", done.stderr)
        return done.stdout


def load_cubin(name: str, cubin: bytes, shared: int, device: int) -> tuple[int, int]:
    """Load a cubin through Triton's driver utilities: ``(CUmodule, CUfunction)`` as integers.

    Triton's loader also opts the function into more than 48 KiB of dynamic shared memory when the
    kernel needs it. Needs a GPU.
    """
    _require()
    from triton.runtime.driver import driver

    loaded = driver.active.utils.load_binary(name, cubin, shared, device)
    return int(loaded[0]), int(loaded[1])


def libdevice() -> Any:
    """Triton's libdevice module (``exp``, ``rsqrt``...), for kernels that call it."""
    _require()
    import triton.language.extra.libdevice as ld

    return ld
