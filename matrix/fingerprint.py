"""The environment fingerprint of the running process: what a cell really is.

Problem: a cell's declared versions (matrix.toml) are a wish; results must be filed under what actually
ran: the installed torch and Triton, the CUDA runtime torch was built for, the driver, the GPU and its
compute capability, the Python and the platform. Two machines with the same stack must produce the same
fingerprint so their results land in the same cell row, and a Triton-only environment has no torch to ask.

Design: versions come from package metadata; torch's CUDA runtime from ``torch/version.py`` read as text
(importing torch costs seconds and memory in the recording process), falling back to ``import torch``;
driver, GPU name and capability from ``nvidia-smi`` (no CUDA context is created in the recording
process), falling back to ``torch.cuda`` only when an NVIDIA driver is present but nvidia-smi is not.
Everything that is not there is ``None``. The project's git sha is recorded per run, not per cell.

Invariants:
- ``probe_environment`` never raises because a component is missing; absent means ``None``.
- ``Environment.fingerprint`` is a stable hash of the cell id, kind and the stack fields only
  (not the host name, not the kernel build, not the git sha).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV_GIT_SHA = "GRACE_MATRIX_GIT_SHA"
_SUBPROCESS_TIMEOUT_S = 20


@dataclass(frozen=True)
class GPUInfo:
    name: str
    capability: str  # "9.0"
    driver: str | None
    count: int


@dataclass(frozen=True)
class Environment:
    """What a cell really is; the fields of the store's ``cells`` table."""

    cell_id: str
    kind: str
    torch_version: str | None
    triton_version: str | None
    cuda_runtime: str | None
    driver_version: str | None
    gpu_name: str | None
    gpu_capability: str | None
    python_version: str
    platform: str
    extra: dict[str, Any] = field(default_factory=dict)

    _IDENTITY = (
        "cell_id",
        "kind",
        "torch_version",
        "triton_version",
        "cuda_runtime",
        "driver_version",
        "gpu_name",
        "gpu_capability",
        "python_version",
        "platform",
    )

    @property
    def fingerprint(self) -> str:
        identity = {name: getattr(self, name) for name in self._IDENTITY}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fingerprint": self.fingerprint}


def probe_environment(cell_id: str = "current", kind: str = "current") -> Environment:
    """Fingerprint the running interpreter (see the module docstring for the sources)."""
    torch_version = _dist_version("torch")
    cuda_runtime, torch_extra = _torch_build_info() if torch_version else (None, {})
    gpu = _gpu_from_nvidia_smi()
    if gpu is None and torch_version and _nvidia_driver_present():
        gpu = _gpu_from_torch()  # a driver but no nvidia-smi (slim images): ask torch, at a CUDA init's cost
    extra: dict[str, Any] = {
        "platform_full": platform.platform(),
        "implementation": sys.implementation.name,
        **torch_extra,
    }
    if gpu is not None:
        extra["gpu_count"] = gpu.count
    if ptxas := _triton_ptxas_version():
        extra["triton_ptxas"] = ptxas
    for dist in ("numpy", "transformers", "cuda-bindings", "cuda-python"):
        if version := _dist_version(dist):
            extra[dist] = version
    return Environment(
        cell_id=cell_id,
        kind=kind,
        torch_version=torch_version,
        triton_version=_dist_version("triton"),
        cuda_runtime=cuda_runtime,
        driver_version=gpu.driver if gpu else _driver_from_proc(),
        gpu_name=gpu.name if gpu else None,
        gpu_capability=gpu.capability if gpu else None,
        python_version=platform.python_version(),
        platform=_platform_name(),
        extra=extra,
    )


def project_git_sha(start: str | os.PathLike[str] | None = None) -> str | None:
    """``GRACE_MATRIX_GIT_SHA``, else the HEAD of the git checkout at ``start`` (``-dirty`` if modified)."""
    if sha := os.environ.get(ENV_GIT_SHA):
        return sha
    cwd = Path(start) if start is not None else Path.cwd()
    head = _run(["git", "rev-parse", "HEAD"], cwd=cwd)
    if head is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd)
    return head + ("-dirty" if dirty else "")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _platform_name() -> str:
    libc, libc_version = platform.libc_ver()
    suffix = f"-{libc}{libc_version}" if libc else ""
    return f"{platform.system()}-{platform.machine()}{suffix}"


def _torch_build_info() -> tuple[str | None, dict[str, Any]]:
    """torch's CUDA runtime (``torch.version.cuda``) without importing torch when possible."""
    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        version_file = Path(location) / "version.py"
        if version_file.is_file():
            values = _literal_assignments(version_file.read_text(encoding="utf-8"))
            if "cuda" in values:
                extra = {"torch_git_version": values.get("git_version"), "torch_hip": values.get("hip")}
                return values["cuda"], {k: v for k, v in extra.items() if v}
    try:  # pragma: no cover - only when version.py is not the plain file it has always been
        import torch

        return torch.version.cuda, {}
    except Exception as exc:  # pragma: no cover
        logger.warning("torch is installed but cannot be imported: %s", exc)
        return None, {"torch_import_error": str(exc)}


def _literal_assignments(source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        try:
            values[name] = ast.literal_eval(value)
        except ValueError:
            continue
    return values


def _gpu_from_nvidia_smi() -> GPUInfo | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader,nounits"])
    if not out:
        return None
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    index = int(visible) if visible.isdigit() and int(visible) < len(rows) else 0
    if len(rows[index]) < 3:
        return None
    name, capability, driver = rows[index][:3]
    return GPUInfo(name=name, capability=capability, driver=driver or None, count=len(rows))


def _gpu_from_torch() -> GPUInfo | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        return GPUInfo(
            name=torch.cuda.get_device_name(0),
            capability=f"{major}.{minor}",
            driver=_driver_from_proc(),
            count=torch.cuda.device_count(),
        )
    except Exception as exc:  # a broken CUDA setup is a fact about the cell, not a reason to stop
        logger.warning("could not query the GPU through torch: %s", exc)
        return None


def _nvidia_driver_present() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def _driver_from_proc() -> str | None:
    """The NVIDIA kernel driver version from /proc on Linux, when a driver is loaded."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def _triton_ptxas_version() -> str | None:
    """The version of the ptxas that Triton ships (the assembler the PTX checks depend on)."""
    spec = importlib.util.find_spec("triton")
    for location in list(spec.submodule_search_locations or []) if spec else []:
        ptxas = Path(location) / "backends" / "nvidia" / "bin" / "ptxas"
        if ptxas.is_file():
            out = _run([str(ptxas), "--version"])
            if out:
                return out.strip().splitlines()[-1]
    return None


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
