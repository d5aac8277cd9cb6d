"""Tensor-parallel suite (marker ``tp``): every TP workload at every TP size, stored like the other suites.

Each test launches one torchrun (``python -m torch.distributed.run --standalone --nproc-per-node N -m
suites.tp.run``, suites/tp/launch.py) for one workload of suites/tp/workloads.py at one TP size, reads the
JSON it writes and emits its records (suites/tp/recording.py): per mode a ``CorrectnessRecord`` for the
workload ``<name>@tp<N>`` (tag ``tp``) and, on CUDA, a ``PerformanceRecord`` with the speedups vs inductor
and pt2cg measured in that run. A launch that gives no results is one ``fail_to_run`` record per mode.

TP sizes: ``--tp-sizes`` (suites/tp/options.py); by default every power of two from 2 up to the visible
CUDA devices, or 2 ranks with gloo on a machine without CUDA (``--suite-device cpu`` forces that). One
GPU: nothing to run, the test skips saying so (as does a ``--tp-sizes`` size above the visible GPUs).
``--modes all`` (the suites' default) means the TP harness's own default modes; ``--tier``,
``--workloads`` (globs) and ``--perf-samples`` apply as in the other suites. On CUDA a test holds the GPU
lock of the performance suite (suites/gpu_lock.py) and shares its xdist group: the run uses every GPU it
names.

A test fails after its records are emitted when a mode, the sharding or reference check, a timing or the
launch failed; it skips with the reasons when every mode skipped.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the TP suite needs torch (Triton-only cells run the PI checks)")

import torch

from suites.gpu_lock import exclusive_gpu
from suites.modes import parse_modes
from suites.options import PERF_GROUP, SuiteOptions
from suites.records import Record
from suites.tp.launch import TPLaunch, launch
from suites.tp.options import TPOptions, default_tp_sizes
from suites.tp.recording import records_from_launch, workload_ref
from suites.tp.run import DEFAULT_MODES
from suites.tp.workloads import TP_WORKLOADS, get

pytestmark = [pytest.mark.tp, pytest.mark.xdist_group(PERF_GROUP)]


def device_type(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def tp_sizes(options: TPOptions, device: str) -> tuple[int, ...]:
    if options.sizes is not None:
        return options.sizes
    return default_tp_sizes(device, torch.cuda.device_count() if device == "cuda" else 0)


def tp_modes(text: str) -> tuple[str, ...]:
    """``all`` (the suites' default) -> the TP harness's default modes; else the modes named."""
    return tuple(m.value for m in parse_modes(DEFAULT_MODES if text.strip() == "all" else text))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tp_size" not in metafunc.fixturenames:
        return
    suite = SuiteOptions.from_config(metafunc.config)
    device = device_type(suite.device)
    sizes = tp_sizes(TPOptions.from_config(metafunc.config), device)
    globs = [g.strip() for g in suite.workloads.split(",") if g.strip()]
    names = [n for n in TP_WORKLOADS if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    visible = torch.cuda.device_count() if device == "cuda" else None
    params = [
        pytest.param(name, size, id=f"{name}-tp{size}", marks=_too_large(size, visible))
        for name in names
        for size in sizes
    ]
    if names and not sizes:
        why = (
            f"{visible} CUDA device(s) visible: tensor parallelism needs 2 or more "
            "(pass --tp-sizes, or --suite-device cpu for 2 gloo ranks on the CPU)"
        )
        params = [
            pytest.param(name, 0, id=f"{name}-no-tp-size", marks=pytest.mark.skip(reason=why))
            for name in names
        ]
    metafunc.parametrize(("tp_workload", "tp_size"), params)


def _too_large(size: int, visible: int | None) -> list[pytest.MarkDecorator]:
    if visible is None or size <= visible:
        return []
    return [pytest.mark.skip(reason=f"TP-{size} needs {size} CUDA devices, {visible} visible")]


def test_tp(
    tp_workload: str,
    tp_size: int,
    suite_options: SuiteOptions,
    pytestconfig: pytest.Config,
    tmp_path: Path,
    grace_record: Callable[[Record], None],
) -> None:
    options = TPOptions.from_config(pytestconfig)
    device = device_type(suite_options.device)
    spec = TPLaunch(
        workload=tp_workload,
        world_size=tp_size,
        device=device,
        tier=suite_options.tier,
        modes=tp_modes(suite_options.modes),
        samples=suite_options.perf_samples if device == "cuda" else 0,
        out=tmp_path / "tp",
        timeout_s=options.timeout_s,
    )
    with exclusive_gpu(enabled=device == "cuda"):
        outcome = launch(spec)
    ref = workload_ref(tp_workload, tp_size, suite_options.tier, get(tp_workload).code_hash)
    records = records_from_launch(outcome, ref, spec.modes)
    for record in records.all:
        grace_record(record)
    if records.problems:
        pytest.fail("\n".join(records.problems), pytrace=False)
    if records.skip_reason is not None:
        pytest.skip(records.skip_reason)
