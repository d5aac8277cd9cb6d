"""The correctness and performance flows (suites/correctness.py, suites/harness.py,
suites/performance.py) on toy workloads on the CPU, with stand-in compiled modes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from suites import harness  # noqa: E402
from suites.accuracy import load_tolerances  # noqa: E402
from suites.correctness import evaluate  # noqa: E402
from suites.modes import Mode  # noqa: E402
from suites.performance import NO_CUDA, measure  # noqa: E402
from suites.records import CorrectnessStatus, PerformanceStatus  # noqa: E402
from suites.workloads import WorkloadUnavailable, get, unregister, workload  # noqa: E402

TOLERANCES = load_tolerances()
SIZES = {"smoke": {}, "standard": {}, "full": {}}
CPU = torch.device("cpu")


class Noisy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


class Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("eager is broken")


def linear(size: Any, device: Any, dtype: Any) -> tuple[Any, tuple[Any, ...]]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).to(device, dtype).eval(), (torch.randn(3, 4, dtype=dtype),)


@pytest.fixture
def toy() -> Iterator[Callable[..., str]]:
    names: list[str] = []

    def register(name: str, builder: Callable[..., Any]) -> str:
        workload(name, sizes=SIZES, tags=["synthetic"], requires=("fakepkg",))(builder)
        names.append(name)
        return name

    yield register
    harness.release()
    for name in names:
        unregister(name)


def fake_modes(monkeypatch: pytest.MonkeyPatch, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Let every mode 'compile' on the CPU into ``make(model)``."""
    monkeypatch.setattr(harness, "unavailable_reason", lambda mode, device: None)
    monkeypatch.setattr(harness, "build", lambda mode, model: model if mode is Mode.EAGER else make(model))


def run(name: str, mode: Mode) -> Any:
    prepared = harness.prepare(get(name), "smoke", CPU)
    return evaluate(prepared, mode, TOLERANCES)


def test_eager_passes_with_float64_figures(toy: Callable[..., str]) -> None:
    record, diagnostics = run(toy("toy_linear", linear), Mode.EAGER)
    assert record.status is CorrectnessStatus.PASS and not diagnostics
    assert record.details["fp64_reference"] == "available"
    assert record.errors["max_abs"] < 1e-5 and record.tolerance["rtol"] == 1e-3
    assert record.workload.name == "toy_linear" and record.workload.code_hash


def test_correct_mode_passes_including_moved_inputs(
    toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_modes(monkeypatch, lambda model: model)
    record, _ = run(toy("toy_good", linear), Mode.PT2CG)
    assert record.status is CorrectnessStatus.PASS, record.reason
    assert record.details["moved_inputs"]["status"] == "pass"
    assert record.details["compile_s"] is not None


def test_stale_input_addresses_are_caught(toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    def stale(model: Any) -> Callable[..., Any]:
        kept: list[tuple[Any, ...]] = []

        def call(*inputs: Any) -> Any:
            if not kept:
                kept.append(inputs)  # like a graph that keeps reading its first inputs' addresses
            return model(*kept[0])

        return call

    fake_modes(monkeypatch, stale)
    record, _ = run(toy("toy_stale", linear), Mode.GRACE_CGCT_PI)
    assert record.status is CorrectnessStatus.FAIL_ACCURACY
    assert record.reason.startswith("after inputs moved to new addresses: new inputs")
    assert record.details["moved_inputs"]["moved"]["status"] == "fail_accuracy"


def test_wrong_numbers_fail(toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_modes(monkeypatch, lambda model: lambda *xs: model(*xs) * 1.1)
    record, _ = run(toy("toy_wrong", linear), Mode.INDUCTOR)
    assert record.status is CorrectnessStatus.FAIL_ACCURACY and record.errors["tol_ratio"] > 1


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("boom", CorrectnessStatus.FAIL_TO_RUN),
        ("CUDA out of memory. Tried to allocate", CorrectnessStatus.OOM),
    ],
)
def test_mode_errors_become_statuses(
    toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch, message: str, status: CorrectnessStatus
) -> None:
    def explode(model: Any) -> Callable[..., Any]:
        def call(*inputs: Any) -> Any:
            raise RuntimeError(message)

        return call

    fake_modes(monkeypatch, explode)
    name = toy(f"toy_{status.value.lower()}", linear)
    record, _ = run(name, Mode.INDUCTOR)
    assert record.status is status and message in (record.reason or "")
    eager, _ = run(name, Mode.EAGER)  # another mode of the same workload is unaffected
    assert eager.status is CorrectnessStatus.PASS


def test_unavailable_mode_is_a_skip_with_reason(toy: Callable[..., str]) -> None:
    record, _ = run(toy("toy_skip", linear), Mode.PT2CG)
    assert record.status is CorrectnessStatus.SKIP and "no CUDA device" in (record.reason or "")
    assert record.details["expected"] is True


def test_missing_package_is_model_fail_to_load(toy: Callable[..., str]) -> None:
    def unavailable(size: Any, device: Any, dtype: Any) -> Any:
        raise WorkloadUnavailable("fakepkg", ImportError("No module named 'fakepkg'"))

    name = toy("toy_unavailable", unavailable)
    for mode in (Mode.EAGER, Mode.PT2CG):
        record, _ = run(name, mode)
        assert record.status is CorrectnessStatus.MODEL_FAIL_TO_LOAD
        assert "cannot import fakepkg" in (record.reason or "") and record.details["expected"] is True


def test_a_package_not_installed_is_a_skip(toy: Callable[..., str]) -> None:
    """A builder's optional package that the environment lacks altogether is the environment's choice,
    not a breakage: ``skip`` with the package named (an installed one that fails to import stays
    ``model_fail_to_load``, above)."""
    from suites.workloads.common import import_optional

    def absent(size: Any, device: Any, dtype: Any) -> Any:
        import_optional("grace_matrix_no_such_package")
        raise AssertionError("unreachable")

    name = toy("toy_absent", absent)
    record, _ = run(name, Mode.EAGER)
    assert record.status is CorrectnessStatus.SKIP and record.details["expected"] is True
    assert "needs grace_matrix_no_such_package, which is not installed here" in (record.reason or "")
    failure = harness.prepare(get(name), "smoke", CPU).load_failure
    assert failure is not None and failure.status is CorrectnessStatus.SKIP  # what performance reads


def test_broken_builder_is_an_unexpected_load_failure(toy: Callable[..., str]) -> None:
    def broken(size: Any, device: Any, dtype: Any) -> Any:
        raise ValueError("bad config")

    record, _ = run(toy("toy_broken_builder", broken), Mode.EAGER)
    assert record.status is CorrectnessStatus.MODEL_FAIL_TO_LOAD and record.details["expected"] is False


def test_eager_failure_and_nondeterminism(toy: Callable[..., str]) -> None:
    broken = toy("toy_broken_eager", lambda s, d, t: (Broken(), (torch.ones(2),)))
    record, _ = run(broken, Mode.INDUCTOR)
    assert record.status is CorrectnessStatus.EAGER_FAIL_TO_RUN and "eager is broken" in (record.reason or "")
    noisy = toy("toy_noisy", lambda s, d, t: (Noisy(), (torch.ones(8),)))
    record, _ = run(noisy, Mode.EAGER)
    assert record.status is CorrectnessStatus.FAIL_ACCURACY
    assert (record.reason or "").startswith("eager_two_runs_differ")


def test_performance_without_cuda_records_skips(toy: Callable[..., str]) -> None:
    prepared = harness.prepare(get(toy("toy_perf", linear)), "smoke", CPU)
    records = measure(prepared, [Mode.EAGER, Mode.INDUCTOR, Mode.PT2CG], 30)
    assert [r.mode for r in records] == ["eager", "inductor", "pt2cg"]
    assert all(r.status is PerformanceStatus.SKIP and r.reason == NO_CUDA for r in records)


def test_prepare_keeps_one_workload(toy: Callable[..., str]) -> None:
    first = harness.prepare(get(toy("toy_one", linear)), "smoke", CPU)
    assert harness.prepare(get("toy_one"), "smoke", CPU) is first
    second = harness.prepare(get(toy("toy_two", linear)), "smoke", CPU)
    assert second is not first and first.model is None  # the previous workload was closed


def test_grace_modes_record_diagnoses_once_and_their_own_stats(
    toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import enum
    import sys
    import types
    from dataclasses import dataclass

    class Code(enum.Enum):
        CPU_TENSOR = "cpu_tensor"

    class Effect(enum.Enum):
        SPLITS_GRAPH = "splits_graph"

    @dataclass
    class Diagnosis:
        code: Code
        node: str
        source: str
        message: str
        transformed: bool
        effect: Effect

    slots: list[dict[str, Any]] = []
    grace = types.ModuleType("grace")
    grace.stats = types.SimpleNamespace(snapshot=lambda: [dict(s) for s in slots])  # type: ignore[attr-defined]
    grace.explain = lambda model, *inputs: types.SimpleNamespace(  # type: ignore[attr-defined]
        diagnoses=[
            Diagnosis(Code.CPU_TENSOR, "arange", "m.py:3", "made on the CPU", True, Effect.SPLITS_GRAPH)
        ]
    )
    monkeypatch.setitem(sys.modules, "grace", grace)

    def compiled(model: Any) -> Callable[..., Any]:
        slots.append({"graph_id": f"g{len(slots)}", "copy_bytes_per_replay": 48 * (len(slots) + 1)})
        return model

    fake_modes(monkeypatch, compiled)
    name = toy("toy_grace", linear)
    record, diagnostics = run(name, Mode.GRACE)
    assert record.status is CorrectnessStatus.PASS
    assert [(d.code, d.effect, d.transformed, d.mode) for d in diagnostics] == [
        ("cpu_tensor", "splits_graph", True, "grace")
    ]
    assert record.details["grace_stats"] == {"g0": {"graph_id": "g0", "copy_bytes_per_replay": 48}}
    record, diagnostics = run(name, Mode.GRACE_CGCT)
    assert diagnostics == [] and list(record.details["grace_stats"]) == ["g1"]


def test_performance_flow_with_a_stand_in_gpu(
    toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """measure() on the CPU with the CUDA-only pieces replaced: statuses, medians and facts per mode."""
    import sys
    import types

    from suites import performance
    from suites.launches import CallFacts

    slots: list[dict[str, Any]] = []
    grace = types.ModuleType("grace")
    grace.stats = types.SimpleNamespace(snapshot=lambda: [dict(s) for s in slots])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "grace", grace)

    def compiled(model: Any) -> Callable[..., Any]:
        slots.append({"graph_id": f"g{len(slots)}", "copy_bytes_per_replay": 16})
        return model

    def explode(*inputs: Any) -> Any:
        raise RuntimeError("replay failed")

    fake_modes(monkeypatch, compiled)
    monkeypatch.setattr(harness, "synchronize", lambda device: None)
    monkeypatch.setattr(harness.PreparedWorkload, "_reset_peak", lambda self: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "stand-in GPU")
    facts = CallFacts(kernel_launches=2, graph_launches=1, kernels_in_graphs=5, busy_ms=0.25, kernel_ms=0.2,
                      memcpy_count=0, memcpy_bytes=0, memset_count=0)  # fmt: skip
    monkeypatch.setattr(performance, "profile_call", lambda call: (call(), facts)[1])

    def fake_timing(calls: dict[str, Callable[[], Any]], samples: int, host: dict[str, list[float]]) -> Any:
        for name, call in calls.items():
            call()
            host[name] = [0.25, 0.5, 0.75]
        return {name: [1.0 + i for i in range(samples)] for name in calls}, {"inductor": "RuntimeError: boom"}

    monkeypatch.setattr(performance, "time_interleaved", fake_timing)
    back_to_back: list[tuple[list[str], int, int]] = []

    def fake_back_to_back(calls: dict[str, Callable[[], Any]], rounds: int, per_sample: int) -> Any:
        back_to_back.append((sorted(calls), rounds, per_sample))
        return {name: [0.5] * rounds for name in calls}, {}

    monkeypatch.setattr(performance, "time_back_to_back", fake_back_to_back)
    prepared = harness.PreparedWorkload(get(toy("toy_gpu", linear)), "smoke", CPU, torch.float32)
    prepared.load()
    prepared.device = torch.device("cuda")
    broken = harness.CompiledMode(Mode.PT2CG_NOPARTITION, fn=explode, inputs=prepared.inputs, compile_s=1.0)
    prepared.compiled[Mode.PT2CG_NOPARTITION] = broken
    modes = [Mode.EAGER, Mode.INDUCTOR, Mode.PT2CG, Mode.PT2CG_NOPARTITION, Mode.GRACE]
    records = {r.mode: r for r in measure(prepared, modes, 5)}
    eager, grace_record = records["eager"], records["grace"]
    assert eager.status is PerformanceStatus.OK and eager.median_ms == 3.0 and len(eager.samples_ms) == 5
    assert (eager.floor_ms, eager.kernel_launches, eager.kernels_in_graphs) == (0.25, 2, 5)
    assert eager.copy_bytes_per_replay is None and eager.details["device_name"] == "stand-in GPU"
    assert eager.details["host_ms_median"] == 0.5
    # back to back: every mode whose latency timing worked, enough calls for 2 ms at the fastest (1.0 ms)
    assert back_to_back == [(["eager", "grace", "pt2cg"], 5, 4)]
    assert eager.details["b2b_ms_median"] == 0.5 and eager.details["b2b_calls_per_sample"] == 4
    assert (
        records["inductor"].status is PerformanceStatus.FAIL_TO_RUN and "boom" in records["inductor"].reason
    )
    assert records["pt2cg"].copy_bytes_per_replay == 0  # CPU-resident inputs are not copied into a graph
    assert records["pt2cg-nopartition"].status is PerformanceStatus.FAIL_TO_RUN
    assert "warm-up" in (records["pt2cg-nopartition"].reason or "")
    assert grace_record.status is PerformanceStatus.OK and grace_record.copy_bytes_per_replay == 16
    assert list(grace_record.details["grace_stats"]) == [f"g{len(slots) - 1}"]


def test_each_mode_window_starts_without_cublas_workspaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """cudagraph trees free cuBLAS's workspaces before recording: a window that began with them alive
    read pt2cg's peak as 0 and charged the next mode for allocating them again."""
    import types

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("synchronize"))
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("clear"), raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a stand-in GPU in use
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: calls.append("base") or 7)
    stand_in = types.SimpleNamespace(device=torch.device("cuda"))
    assert harness.PreparedWorkload._reset_peak(stand_in) == 7  # type: ignore[arg-type]
    assert calls == ["synchronize", "clear", "empty", "reset", "base"]


def test_calls_peak_leaves_out_the_compiling_call(
    toy: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """peak_mem_bytes spans compile and warm-up; calls_peak_mem_bytes only the calls after the first (whose
    figure depends on what Inductor's caches held), both above the window's base."""
    memory = {"allocated": 10, "peak": 10, "reserved": 20, "reserved_peak": 20}

    def bump(to: int, reserved: int) -> None:
        memory["peak"] = max(memory["peak"], to)
        memory["reserved"] = max(memory["reserved"], reserved)  # cached until empty_cache
        memory["reserved_peak"] = max(memory["reserved_peak"], memory["reserved"])

    def reset(*a: Any, **k: Any) -> None:
        memory["peak"] = memory["allocated"]
        memory["reserved_peak"] = memory["reserved"]

    def empty_cache() -> None:
        memory["reserved"] = 25  # what stays in use: the compiled mode's own blocks

    def make(model: Any) -> Callable[..., Any]:
        calls = [0]

        def fn(*inputs: Any) -> Any:
            calls[0] += 1
            bump(*((110, 300) if calls[0] == 1 else (50, 80)))  # compile-time memory, then the calls
            return model(*inputs)

        return fn

    fake_modes(monkeypatch, make)
    monkeypatch.setattr(harness, "synchronize", lambda device: None)

    def open_window(self: Any) -> int:
        reset()
        return memory["allocated"]

    monkeypatch.setattr(harness.PreparedWorkload, "_reset_peak", open_window)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: memory["peak"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: memory["allocated"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: memory["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a, **k: memory["reserved_peak"])
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    prepared = harness.PreparedWorkload(get(toy("toy_peaks", linear)), "smoke", CPU, torch.float32)
    prepared.load()
    prepared.device = torch.device("cuda")
    entry = prepared.compiled_mode(Mode.GRACE)
    assert entry.failure is None
    assert (entry.peak_mem_bytes, entry.calls_peak_mem_bytes, entry.resident_mem_bytes) == (100, 40, 0)
    # reserved: above the window's start (20), over the calls after the compiling one, whose cached
    # blocks (300) went back first
    assert entry.calls_peak_reserved_bytes == 60
