"""The workload registry: a dict, a decorator that fills it and getters that read it.

Problem: the correctness and performance suites, the GPU scripts and the report all need the same list
of workloads, each buildable at several sizes (tiers) on any device, reproducibly and without downloads,
and each result must say exactly which code produced it.

Design: a workload is a builder function ``build(size, device, dtype) -> (model, example_inputs)``
registered with ``@workload(name, tags=..., sizes={tier: size})``. ``Workload.factory(tier)`` binds the
size and returns the ``factory(device, dtype)`` the suites call. Sizes are plain frozen mappings, so the
size of every tier is data that the code hash covers. A builder that needs an optional package
(``timm``, ``torchvision``, ``transformers``) imports it inside and raises ``WorkloadUnavailable`` when
the import fails; the suites turn that into the ``model_fail_to_load`` status instead of crashing, or
into ``skip`` where the package is not installed at all (the environment's choice, not a breakage).

Invariants:
- Names are unique; registering a name twice is an error (a silent overwrite would mix results).
- ``code_hash`` depends only on the builder's source, the sources of the objects it declares in
  ``code`` and the size table: not on file paths, line numbers or the process, so it is stable across
  machines and changes when (and only when) what runs changes.
- This module does not import torch: listing workloads works in a Triton-only cell.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import inspect
import json
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class Tier(str, enum.Enum):
    """How big a workload runs: ``smoke`` on a CPU in seconds, ``standard`` within one GPU lease,
    ``full`` at the sizes the paper reports."""

    SMOKE = "smoke"
    STANDARD = "standard"
    FULL = "full"


class Tag(str, enum.Enum):
    """Which GraCE technique (or which capture obstacle) a workload exercises."""

    CGCT = "cgct"  # CPU tensors or ops that keep PyTorch2-CG from capturing (what CGCT removes)
    PI = "pi"  # large non-static inputs that PyTorch2-CG copies on every replay
    SCG = "scg"  # a graph whose capture may not pay: the selective choice matters
    VENDOR = "vendor"  # cuBLAS/cuDNN kernels (vendor-kernel parameter indirection)
    DYNAMIC = "dynamic"  # data-dependent shapes or control flow
    MUTATION = "mutation"  # the model writes into one of its inputs
    GRAPH_BREAK = "graph_break"  # Dynamo splits the model into several graphs
    LAUNCH_BOUND = "launch_bound"  # many small kernels: CUDA graphs pay
    TRANSFORMER = "transformer"
    VISION = "vision"
    RECSYS = "recsys"
    HPC = "hpc"
    LLM = "llm"
    SPEECH = "speech"
    SYNTHETIC = "synthetic"
    TRAINING = "training"  # one call is a training iteration: forward, backward, optimizer step


class WorkloadError(LookupError):
    """A workload name or selection that does not exist, with the names that do."""


class WorkloadUnavailable(RuntimeError):
    """The workload cannot be built here because a package it needs cannot be imported."""

    def __init__(self, package: str, cause: BaseException | str, *, installed: bool = True) -> None:
        detail = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else cause
        root = cause
        while isinstance(root, BaseException) and (root.__cause__ or root.__context__) is not None:
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        if isinstance(root, BaseException) and root is not cause:
            detail += f" (caused by {type(root).__name__}: {root})"
        top = package.partition(".")[0]
        super().__init__(f"cannot import {package}: {detail}" if installed else f"needs {top}, {detail}")
        self.package = package
        self.installed = installed  # False: the environment has no such package (a skip, not a failure)


Builder = Callable[..., tuple[Any, tuple[Any, ...]]]
Factory = Callable[[Any, Any], tuple[Any, tuple[Any, ...]]]


@dataclass(frozen=True)
class Workload:
    """One registered workload. ``sizes`` maps every tier to that tier's size parameters.

    ``mutates_inputs``: the model writes into some of its inputs; the correctness suite then also
    compares the inputs after the call. ``variant`` (optional) makes a second input set with new values
    in new storage from the first; by default floating inputs are rolled (see suites.tensors).
    ``requires`` names the optional packages the builder imports.
    """

    name: str
    builder: Builder
    sizes: Mapping[Tier, Mapping[str, Any]]
    tags: tuple[Tag, ...] = ()
    description: str = ""
    requires: tuple[str, ...] = ()
    mutates_inputs: bool = False
    variant: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
    code: tuple[Any, ...] = field(default=(), repr=False)

    def size(self, tier: Tier | str) -> Mapping[str, Any]:
        return self.sizes[Tier(tier)]

    def factory(self, tier: Tier | str) -> Factory:
        """The ``factory(device, dtype) -> (model, example_inputs)`` of this workload at ``tier``."""
        size = self.size(tier)

        def factory(device: Any, dtype: Any) -> tuple[Any, tuple[Any, ...]]:
            return self.builder(size, device, dtype)

        factory.__name__ = f"{self.name}[{Tier(tier).value}]"
        return factory

    @property
    def code_hash(self) -> str:
        return code_hash(self)

    def ref(self, tier: Tier | str) -> Any:
        """The ``WorkloadRef`` records carry for this workload at ``tier``."""
        from suites.records import WorkloadRef

        return WorkloadRef(
            name=self.name,
            tier=Tier(tier).value,
            tags=tuple(tag.value for tag in self.tags),
            code_hash=self.code_hash,
        )


_REGISTRY: dict[str, Workload] = {}
_HASHES: dict[str, str] = {}


def _source(obj: Any) -> str:
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):  # built-ins, C extensions: fall back to the qualified name
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    return textwrap.dedent(text).replace("\r\n", "\n")


def code_hash(wl: Workload) -> str:
    """sha256 (first 16 hex digits) over the builder's source, declared code objects and sizes."""
    if wl.name in _HASHES and _REGISTRY.get(wl.name) is wl:
        return _HASHES[wl.name]
    digest = hashlib.sha256()
    digest.update(wl.name.encode())
    for obj in (wl.builder, *wl.code, *((wl.variant,) if wl.variant else ())):
        digest.update(b"\0")
        digest.update(_source(obj).encode())
    sizes = {tier.value: dict(size) for tier, size in sorted(wl.sizes.items(), key=lambda kv: kv[0].value)}
    digest.update(json.dumps(sizes, sort_keys=True, default=repr).encode())
    value = digest.hexdigest()[:16]
    if _REGISTRY.get(wl.name) is wl:
        _HASHES[wl.name] = value
    return value


def workload(
    name: str,
    *,
    sizes: Mapping[Tier | str, Mapping[str, Any]],
    tags: Iterable[Tag | str] = (),
    description: str = "",
    requires: Iterable[str] = (),
    mutates_inputs: bool = False,
    variant: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None,
    code: Iterable[Any] = (),
) -> Callable[[Builder], Builder]:
    """Register ``build(size, device, dtype)`` under ``name``. Every tier must have a size."""

    def decorate(builder: Builder) -> Builder:
        table = {Tier(tier): MappingProxyType(dict(size)) for tier, size in sizes.items()}
        missing = [tier.value for tier in Tier if tier not in table]
        if missing:
            raise ValueError(f"workload {name!r} has no size for tier(s) {missing}; give every tier a size")
        register(
            Workload(
                name=name,
                builder=builder,
                sizes=MappingProxyType(table),
                tags=tuple(Tag(tag) for tag in tags),
                description=description or (inspect.getdoc(builder) or "").split("\n")[0],
                requires=tuple(requires),
                mutates_inputs=mutates_inputs,
                variant=variant,
                code=tuple(code),
            )
        )
        return builder

    return decorate


def register(wl: Workload) -> Workload:
    if wl.name in _REGISTRY:
        raise ValueError(f"workload {wl.name!r} is already registered; workload names must be unique")
    _REGISTRY[wl.name] = wl
    return wl


def unregister(name: str) -> None:
    """Remove a workload (tests use this to keep the registry as they found it)."""
    _REGISTRY.pop(name, None)
    _HASHES.pop(name, None)


def get(name: str) -> Workload:
    try:
        return _REGISTRY[name]
    except KeyError:
        close = fnmatch.filter(sorted(_REGISTRY), f"*{name}*")
        hint = (
            f"; did you mean {', '.join(close[:5])}?" if close else f"; known: {', '.join(sorted(_REGISTRY))}"
        )
        raise WorkloadError(f"no workload named {name!r}{hint}") from None


def names() -> list[str]:
    """Registered names, in registration order (the order the suites run them)."""
    return list(_REGISTRY)


def all_workloads() -> list[Workload]:
    return list(_REGISTRY.values())


def select(patterns: str | Iterable[str] | None = None, tags: Iterable[Tag | str] = ()) -> list[Workload]:
    """Workloads whose name matches any of the comma-separated globs (all when empty or ``*``) and that
    carry every tag in ``tags``. A pattern that matches nothing is an error, so typos do not pass."""
    if patterns is None:
        globs = ["*"]
    elif isinstance(patterns, str):
        globs = [p.strip() for p in patterns.split(",") if p.strip()] or ["*"]
    else:
        globs = [p.strip() for p in patterns if p.strip()] or ["*"]
    wanted = {Tag(tag) for tag in tags}
    unmatched = [g for g in globs if not fnmatch.filter(list(_REGISTRY), g)]
    if unmatched:
        raise WorkloadError(f"no workload matches {unmatched}; known: {', '.join(_REGISTRY)}")
    return [
        wl
        for wl in _REGISTRY.values()
        if any(fnmatch.fnmatchcase(wl.name, g) for g in globs) and wanted.issubset(wl.tags)
    ]
