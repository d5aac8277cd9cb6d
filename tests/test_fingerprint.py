"""The environment fingerprint: stable, complete where it can be, and fine without torch."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from matrix import fingerprint
from matrix.fingerprint import probe_environment, project_git_sha

ROOT = Path(__file__).resolve().parent.parent


def test_probe_describes_this_interpreter() -> None:
    env = probe_environment("current", "current")
    assert env.python_version == ".".join(map(str, sys.version_info[:3]))
    assert env.platform.startswith(("Linux-", "Darwin-", "Windows-"))
    if importlib.util.find_spec("torch") is not None:
        assert env.torch_version == importlib.metadata.version("torch")
    assert (env.gpu_name is None) == (env.gpu_capability is None)
    assert len(env.fingerprint) == 64


def test_fingerprint_is_stable_and_ignores_host_details() -> None:
    env = probe_environment("torch-2.13", "venv")
    again = probe_environment("torch-2.13", "venv")
    assert env.fingerprint == again.fingerprint
    moved = dataclasses.replace(env, extra={"platform_full": "another kernel build"})
    assert moved.fingerprint == env.fingerprint
    assert dataclasses.replace(env, torch_version="2.4.1").fingerprint != env.fingerprint
    assert dataclasses.replace(env, cell_id="other").fingerprint != env.fingerprint


def test_probe_without_torch_installed(monkeypatch) -> None:
    real_version, real_find_spec = importlib.metadata.version, importlib.util.find_spec

    def version(name: str) -> str:
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    def find_spec(name: str, *args):
        return None if name == "torch" else real_find_spec(name, *args)

    monkeypatch.setattr(fingerprint.importlib.metadata, "version", version)
    monkeypatch.setattr(fingerprint.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(fingerprint.shutil, "which", lambda name: None)  # no nvidia-smi either
    env = probe_environment("triton-3.7", "triton-only")
    assert env.torch_version is None and env.cuda_runtime is None and env.gpu_name is None
    json.dumps(env.to_dict())  # storable as is


def test_probing_does_not_import_torch() -> None:
    code = "import sys; from matrix.fingerprint import probe_environment; probe_environment(); "
    code += "print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_gpu_from_nvidia_smi_output(monkeypatch) -> None:
    monkeypatch.setattr(fingerprint.shutil, "which", lambda name: "/bin/nvidia-smi")
    monkeypatch.setattr(
        fingerprint, "_run", lambda argv, cwd=None: "NVIDIA H200, 9.0, 580.65.06\nNVIDIA H200, 9.0, 580.65.06"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = fingerprint._gpu_from_nvidia_smi()
    assert gpu == fingerprint.GPUInfo(name="NVIDIA H200", capability="9.0", driver="580.65.06", count=2)


def test_torch_cuda_runtime_read_without_import(tmp_path) -> None:
    values = fingerprint._literal_assignments(
        "__version__ = '2.4.1+cu121'\ncuda: Optional[str] = '12.1'\nhip = None\n"
    )
    assert values == {"__version__": "2.4.1+cu121", "cuda": "12.1", "hip": None}


def test_git_sha(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(fingerprint.ENV_GIT_SHA, "feedface")
    assert project_git_sha() == "feedface"
    monkeypatch.delenv(fingerprint.ENV_GIT_SHA)
    assert project_git_sha(tmp_path) is None  # not a checkout
