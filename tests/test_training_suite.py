"""Training workloads in the suites (CPU): a TrainStep trains, the training correctness check passes for
inductor and fails when the mode's step is perturbed, phases split a profile, and the suites run under
pytest records correctness and performance for a ``*_train`` workload."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from suites.accuracy import load_tolerances  # noqa: E402
from suites.correctness import evaluate  # noqa: E402
from suites.harness import PreparedWorkload  # noqa: E402
from suites.launches import PhaseFacts, phases_from_trace  # noqa: E402
from suites.modes import Mode  # noqa: E402
from suites.performance import PERF_WARMUP_CALLS, measure  # noqa: E402
from suites.records import CorrectnessStatus, PerformanceStatus  # noqa: E402
from suites.training import BACKWARD, FORWARD, OPTIMIZER, PHASES, TrainStep, initial_state, run_trace  # noqa: E402
from suites.workloads import Tag, get, select  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = "nvidia_deeprecommender_train"  # tiny, with dropout (p=0.8): the masks must match too
TOLERANCES = load_tolerances()
ISSUE_MODELS = {
    "XLNetLMHeadModel_train", "MT5ForConditionalGeneration_train",
    "BlenderbotSmallForConditionalGeneration_train", "DistilGPT2_train", "DebertaForMaskedLM_train",
    "BertForMaskedLM_train", "dcgan_train", "nvidia_deeprecommender_train",
}  # fmt: skip
AMP_MODELS = {"DistilGPT2_train_amp", "BertForMaskedLM_train_amp"}


def test_training_workloads_are_tagged() -> None:
    assert {wl.name for wl in select(tags=[Tag.TRAINING])} == ISSUE_MODELS | AMP_MODELS
    assert all("_train" in wl.name for wl in select(tags=[Tag.TRAINING]))


def test_train_step_trains_and_restores() -> None:
    model, inputs = get(WORKLOAD).factory("smoke")("cpu", torch.float32)
    start = initial_state(model)
    step = TrainStep(Mode.EAGER, copy.deepcopy(model), "cpu")
    first = run_trace(step, inputs)
    assert step.steps == 3 and [p for p, _ in first.loss] == ["loss.step1", "loss.step2", "loss.step3"]
    assert all(torch.isfinite(t).all() for _, t in first.loss)
    names = {f"param.{n}" for n, _ in model.named_parameters()}
    assert {p for p, _ in first.param} == names and {
        p.replace("grad", "param", 1) for p, _ in first.grad
    } == names
    moved = [p for p, t in first.param if not torch.equal(t, start[p.removeprefix("param.")])]
    assert sorted(moved) == sorted(names)  # every parameter took three steps
    assert all(p.grad is None for p in step.model.parameters())  # zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), start.values(), strict=True))
    step.restore(start)
    again = run_trace(step, inputs)  # same state, same seeds: the same dropout masks, the same numbers
    for quantity, leaves in first.quantities().items():
        assert all(
            torch.equal(a, b) for (_, a), (_, b) in zip(leaves, again.quantities()[quantity], strict=True)
        )


def _prepared(name: str) -> PreparedWorkload:
    """A prepared workload of this test's own (not the process's current one, which others replace)."""
    prepared = PreparedWorkload(get(name), "smoke", torch.device("cpu"), torch.float32)
    prepared.load()
    assert prepared.load_failure is None, prepared.load_failure
    return prepared


@pytest.fixture(scope="module")
def prepared() -> Iterator[PreparedWorkload]:
    prepared = _prepared(WORKLOAD)
    yield prepared
    prepared.close()


def test_eager_and_inductor_pass(prepared: PreparedWorkload) -> None:
    eager, _ = evaluate(prepared, Mode.EAGER, TOLERANCES)
    assert eager.status is CorrectnessStatus.PASS, eager.reason
    assert eager.details["fp64_reference"] == "available" and set(eager.details["training"]) == {
        "loss", "grad", "param"
    }  # fmt: skip
    record, _ = evaluate(prepared, Mode.INDUCTOR, TOLERANCES)
    assert record.status is CorrectnessStatus.PASS, record.reason
    assert record.mode == "inductor" and record.workload.name == WORKLOAD
    assert record.details["optimizer"]["kind"] == "sgd" and record.details["training_steps"] == 3
    for figures in record.details["training"].values():
        assert figures["status"] == "pass" and "rmse_fp64" in figures["errors"]


def test_perturbed_forward_fails(prepared: PreparedWorkload, monkeypatch: pytest.MonkeyPatch) -> None:
    step = prepared.compiled_mode(Mode.INDUCTOR).fn
    assert isinstance(step, TrainStep)
    compiled = step.forward
    monkeypatch.setattr(step, "forward", lambda *inputs: compiled(*inputs) * 1.001)
    record, _ = evaluate(prepared, Mode.INDUCTOR, TOLERANCES)
    assert record.status is CorrectnessStatus.FAIL_ACCURACY and record.reason.startswith("loss: ")


def test_perturbed_optimizer_step_fails(prepared: PreparedWorkload, monkeypatch: pytest.MonkeyPatch) -> None:
    step = prepared.compiled_mode(Mode.INDUCTOR).fn
    assert isinstance(step, TrainStep)
    monkeypatch.setattr(step, "spec", dataclasses.replace(step.spec, lr=step.spec.lr * 1.01))
    record, _ = evaluate(prepared, Mode.INDUCTOR, TOLERANCES)
    assert record.status is CorrectnessStatus.FAIL_ACCURACY, record.reason
    assert record.details["training"]["param"]["status"] == "fail_accuracy"


def test_autocast_workload_runs_eager_in_bfloat16() -> None:
    amp = _prepared("BertForMaskedLM_train_amp")
    try:
        model, inputs = amp.model, amp.inputs
        step = TrainStep(Mode.EAGER, copy.deepcopy(model), "cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):  # what the step does: the logits come out bf16
            assert model.model(*inputs[:-1]).logits.dtype == torch.bfloat16
        assert step.details()["autocast"] == "bfloat16" and step(*inputs).dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in step.model.parameters())
        record, _ = evaluate(amp, Mode.EAGER, TOLERANCES)
        assert record.status is CorrectnessStatus.PASS and record.details["dtype"] == "bfloat16"
    finally:
        amp.close()


def test_training_tolerances_name_the_fix() -> None:
    assert TOLERANCES.for_training("grad", "torch.float32").rtol > 0
    with pytest.raises(KeyError, match=r"\[training.float16.loss\]"):
        TOLERANCES.for_training("loss", "float16")


def _event(cat: str, name: str, ts: float, dur: float = 1.0, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_phases_split_kernels_by_the_range_of_their_launch() -> None:
    def launched(api: str, ts: float, correlation: int, *kernels: str) -> list[dict[str, Any]]:
        host = _event("cuda_runtime", api, ts, correlation=correlation)
        return [host, *(_event("kernel", k, 50 + ts, correlation=correlation) for k in kernels)]

    ranges = [_event("user_annotation", name, 10 * i, 10) for i, name in enumerate(PHASES)]
    trace = {"traceEvents": [
        *ranges, *launched("cudaLaunchKernel", 1, 1, "fwd"),
        *launched("cudaGraphLaunch", 12, 2, "bwd_a", "bwd_b"),  # backward, from autograd's thread
        *launched("cudaLaunchKernel", 21, 3, "adam"), *launched("cudaLaunchKernel", 40, 4, "late"),
    ]}  # fmt: skip
    assert phases_from_trace(trace, PHASES) == {
        FORWARD: PhaseFacts(kernel_launches=1, graph_launches=0, kernels_in_graphs=0),
        BACKWARD: PhaseFacts(kernel_launches=0, graph_launches=1, kernels_in_graphs=2),
        OPTIMIZER: PhaseFacts(kernel_launches=1, graph_launches=0, kernels_in_graphs=0),
    }


def test_suites_record_a_training_workload(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "scripts" / "gpu")])}
    env.pop("GRACE_SUITE_TIER", None)
    argv = [sys.executable, "-m", "pytest", "suites/test_correctness.py", "suites/test_performance.py",
            "-p", "record_jsonl", f"--record-jsonl={records}", "-p", "no:cacheprovider", "-q",
            "--suite-device=cpu", f"--workloads={WORKLOAD}", "--modes=eager,pt2cg,raw-graph"]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(line)["record"] for line in records.read_text().splitlines()]
    statuses = {(r["kind"], r["mode"]): r["status"] for r in lines}
    assert statuses == {
        ("correctness", "eager"): "pass",
        ("correctness", "pt2cg"): "skip",
        ("performance", "eager"): "skip",
        ("performance", "pt2cg"): "skip",
        ("performance", "raw-graph"): "skip",
    }
    eager = next(r for r in lines if r["kind"] == "correctness" and r["mode"] == "eager")
    assert (
        "training" in eager["workload"]["tags"] and eager["details"]["training"]["loss"]["status"] == "pass"
    )


def test_performance_times_iterations_with_a_stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure() on the CPU with the CUDA-only pieces replaced: one sample is one training iteration,
    and the profile's phases reach the record."""
    from suites import harness, performance
    from suites.launches import CallFacts

    facts = CallFacts(kernel_launches=7, graph_launches=0, kernels_in_graphs=0, busy_ms=0.5, kernel_ms=0.4,
                      memcpy_count=0, memcpy_bytes=0, memset_count=0)  # fmt: skip
    split = {name: PhaseFacts(i + 1, 0, 0) for i, name in enumerate(PHASES)}
    monkeypatch.setattr(harness, "synchronize", lambda device: None)
    monkeypatch.setattr(harness.PreparedWorkload, "_reset_peak", lambda self: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "stand-in GPU")
    monkeypatch.setattr(performance, "profile_call_phases", lambda call, phases: (call(), (facts, split))[1])

    def fake_timing(calls: dict[str, Any], samples: int, host: dict[str, list[float]]) -> Any:
        for name, call in calls.items():
            for _ in range(samples):
                call()
            host[name] = [0.5]
        return {name: [2.0] * samples for name in calls}, {}

    monkeypatch.setattr(performance, "time_interleaved", fake_timing)
    monkeypatch.setattr(performance, "time_back_to_back", lambda calls, samples, per: ({}, {}))
    prepared = _prepared(WORKLOAD)
    try:
        prepared.device = torch.device("cuda")  # CPU tensors: only the suite's CUDA checks are fooled
        (record,) = measure(prepared, [Mode.EAGER], 4)
        step = prepared.compiled[Mode.EAGER].fn
        assert isinstance(step, TrainStep) and step.steps == 3 + PERF_WARMUP_CALLS + 1 + 4
        assert record.status is PerformanceStatus.OK and record.median_ms == 2.0
        assert record.kernel_launches == 7 and record.details["training_iteration"] is True
        assert record.details["phases"] == {
            "forward": split[FORWARD].to_dict(),
            "backward": split[BACKWARD].to_dict(),
            "optimizer": split[OPTIMIZER].to_dict(),
        }
        assert record.details["optimizer"]["kind"] == "sgd" and record.details["set_to_none"] is True
    finally:
        prepared.close()
