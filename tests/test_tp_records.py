"""suites.tp.recording, suites.tp.launch and suites.tp.options: TP results files (written with
suites/tp/results.py's writer) as suites records, the test's verdict, and a launch that fails (missing
launcher module, timeout, missing or unreadable JSON, non-zero exit) as one ``fail_to_run`` per mode. Only
the last test launches torchrun (TP-2 on the CPU, as suites/test_tp.py does)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from suites.records import CorrectnessStatus, PerformanceStatus, record_from_property
from suites.tp.launch import (
    NO_MULTICAST,
    PACKAGE_ROOT,
    LaunchOutcome,
    Redactor,
    TPLaunch,
    launch,
    rank_failure,
)
from suites.tp.options import CPU_TP_SIZES, default_tp_sizes, parse_tp_sizes
from suites.tp.recording import (
    TAG,
    deciding_check,
    launcher_failure_records,
    records_from_launch,
    records_from_results,
    workload_ref,
)
from suites.tp.results import ModeResult, RankCheck, TimingResult, TPRunResult, read_results, write_results

S = CorrectnessStatus
ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"rtol": 1e-3, "atol": 1e-3, "fp64_multiplier": 2.0, "fp64_floor_divisor": 10.0}


def figures(ratio: float) -> dict[str, float | None]:
    return {"max_abs": ratio * 1e-3, "rel_l2": ratio * 1e-4, "cosine": 1.0, "tol_ratio": ratio}


def checks(*per_rank: tuple[str, float]) -> dict[str, list[RankCheck]]:
    """The same verdicts on every input set: ``(status, tol_ratio)`` per rank."""
    ranks = [
        RankCheck(r, status, f"{status} on rank {r}", figures(x)) for r, (status, x) in enumerate(per_rank)
    ]
    return {name: list(ranks) for name in ("inputs", "moved_inputs", "inputs_again")}


def run_result(device: str = "cuda", world: int = 2, **overrides: object) -> TPRunResult:
    """A run of xlnet_tp: eager and inductor pass, pt2cg fails its accuracy check on rank 1, grace fails
    to run on rank 0; on CUDA eager and inductor are timed."""
    passing = "6 rank checks pass"
    modes = {
        "eager": ModeResult(
            "eager", S.PASS, passing, "eager", 0.01, checks=checks(("pass", 0.1), ("pass", 0.2))
        ),
        "inductor": ModeResult(
            "inductor",
            S.PASS,
            passing,
            "inductor",
            4.0,
            {"graph_breaks": 0},
            checks=checks(("pass", 0.3), ("pass", 0.1)),
        ),
        "pt2cg": ModeResult(
            "pt2cg",
            S.FAIL_ACCURACY,
            "rank 1: beyond rtol",
            "pt2cg",
            9.0,
            checks=checks(("pass", 0.5), ("fail_accuracy", 7.0)),
        ),
        "grace": ModeResult(
            "grace", S.FAIL_TO_RUN, "rank 0: RuntimeError: boom", "grace", errors={0: "RuntimeError: boom"}
        ),
    }
    timing = TimingResult(
        "ok",
        samples=3,
        rule="step_ms[i] = max over ranks of sample i",
        samples_ms={
            "eager": {0: [2.0, 2.2, 2.1], 1: [2.1, 2.0, 2.3]},
            "inductor": {0: [1.0, 1.1, 1.0], 1: [1.2, 1.0, 1.0]},
        },
        step_ms={"eager": [2.1, 2.2, 2.3], "inductor": [1.2, 1.1, 1.0]},
        median_ms={"eager": 2.2, "inductor": 1.1},
        speedup_vs_inductor={"eager": 0.5, "inductor": 1.0},
    )
    no_cuda = TimingResult("skip", "no CUDA device: CPU timings mean nothing")
    values: dict[str, object] = {
        "workload": {"name": "xlnet_tp", "tier": "standard", "description": "XLNet", "size": {"heads": 16},
                     "code_hash": "0123456789abcdef"},
        "world_size": world, "device": device, "backend": "nccl" if device == "cuda" else "gloo",
        "dtype": "float32", "torch": "2.13.0", "created_at": "2026-01-01T00:00:00Z",
        "command": f"torchrun --nproc-per-node={world} -m suites.tp.run", "tolerance": TOLERANCE,
        "reference": {"status": "pass", "why": "2 rank checks pass"},
        "sharding": {"status": "pass", "why": "2 rank checks pass", "checks": []},
        "modes": modes,
        "timing": timing if device == "cuda" else no_cuda,
    }  # fmt: skip
    values.update(overrides)
    return TPRunResult(**values)  # type: ignore[arg-type]


def written(tmp_path: Path, result: TPRunResult) -> dict[str, object]:
    """The result through the writer and the reader, as a later stage sees it."""
    return read_results(write_results(result, tmp_path))


# --- results -> records -------------------------------------------------------------------------------


def test_every_mode_is_one_correctness_record_of_the_tp_workload(tmp_path: Path) -> None:
    records = records_from_results(written(tmp_path, run_result()))
    by_mode = {r.mode: r for r in records.correctness}
    assert set(by_mode) == {"eager", "inductor", "pt2cg", "grace"}
    ref = by_mode["eager"].workload
    assert (ref.name, ref.tier, ref.tags, ref.code_hash) == (
        "xlnet_tp@tp2",
        "standard",
        (TAG,),
        "0123456789abcdef",
    )
    assert {m: r.status for m, r in by_mode.items()} == {
        "eager": CorrectnessStatus.PASS,
        "inductor": CorrectnessStatus.PASS,
        "pt2cg": CorrectnessStatus.FAIL_ACCURACY,
        "grace": CorrectnessStatus.FAIL_TO_RUN,
    }
    assert by_mode["grace"].reason == "rank 0: RuntimeError: boom"
    assert by_mode["grace"].details["rank_errors"] == {"0": "RuntimeError: boom"}
    assert by_mode["grace"].errors == {} and by_mode["grace"].tolerance == {}
    # errors: the figures of the deciding check (the failing rank), tolerance: the run's
    assert by_mode["pt2cg"].errors["tol_ratio"] == 7.0 and by_mode["pt2cg"].tolerance == TOLERANCE
    assert by_mode["pt2cg"].details["deciding_check"]["rank"] == 1
    assert by_mode["inductor"].errors["tol_ratio"] == 0.3  # all pass: the closest call
    details = by_mode["inductor"].details
    assert (details["world_size"], details["backend"], details["device"]) == (2, "nccl", "cuda")
    assert details["runs_as"] == "inductor" and details["compile_facts"] == {"graph_breaks": 0}
    assert [c["rank"] for c in details["checks"]["moved_inputs"]] == [0, 1]
    assert details["sharding"] == {"status": "pass", "why": "2 rank checks pass"}
    for record in records.all:  # what the grace_record fixture carries survives the round trip
        assert record_from_property(record.to_property()) == record


def test_failing_modes_fail_the_test_and_name_mode_status_and_reason(tmp_path: Path) -> None:
    records = records_from_results(written(tmp_path, run_result()))
    assert records.problems == (  # modes in the file's order (the writer sorts keys)
        "grace: fail_to_run: rank 0: RuntimeError: boom",
        "pt2cg: fail_accuracy: rank 1: beyond rtol",
    )
    assert records.skip_reason is None


def test_on_cuda_each_mode_has_a_performance_record_with_samples_median_and_speedups(tmp_path: Path) -> None:
    records = records_from_results(written(tmp_path, run_result()))
    perf = {r.mode: r for r in records.performance}
    assert set(perf) == {"eager", "inductor", "pt2cg", "grace"}
    inductor = perf["inductor"]
    assert inductor.status is PerformanceStatus.OK and inductor.reason is None
    assert inductor.samples_ms == (1.2, 1.1, 1.0) and inductor.median_ms == 1.1 and inductor.compile_s == 4.0
    assert inductor.workload.name == "xlnet_tp@tp2"
    assert inductor.details["speedup_vs_inductor"] == 1.0 and inductor.details["speedup_vs_pt2cg"] is None
    assert perf["eager"].details["speedup_vs_inductor"] == 0.5
    assert perf["eager"].details["samples_ms_by_rank"] == {"0": [2.0, 2.2, 2.1], "1": [2.1, 2.0, 2.3]}
    assert perf["eager"].details["world_size"] == 2
    # modes that were not timed skip, saying why
    assert perf["grace"].status is PerformanceStatus.SKIP and perf["grace"].median_ms is None
    assert perf["grace"].reason == "not timed: fail_to_run: rank 0: RuntimeError: boom"


def test_a_mode_whose_timing_failed_is_fail_to_run_or_oom(tmp_path: Path) -> None:
    result = run_result()
    result.timing.errors.update(
        eager="rank 1: RuntimeError: launch failed", inductor="rank 0: CUDA out of memory"
    )
    records = records_from_results(written(tmp_path, result))
    perf = {r.mode: r for r in records.performance}
    assert perf["eager"].status is PerformanceStatus.FAIL_TO_RUN
    assert perf["eager"].reason == "rank 1: RuntimeError: launch failed"
    assert perf["inductor"].status is PerformanceStatus.OOM
    assert "eager timing: fail_to_run: rank 1: RuntimeError: launch failed" in records.problems


def test_on_a_cpu_there_are_no_performance_records(tmp_path: Path) -> None:
    records = records_from_results(written(tmp_path, run_result(device="cpu")))
    assert records.performance == ()
    assert {r.details["backend"] for r in records.correctness} == {"gloo"}


def test_when_every_mode_skips_the_test_skips_with_the_reasons(tmp_path: Path) -> None:
    why = "xlnet_tp[standard]: heads=16 not divisible by the TP world size 3"
    modes = {m: ModeResult(m, CorrectnessStatus.SKIP, why, m) for m in ("eager", "inductor")}
    result = run_result(
        device="cpu",
        world=3,
        modes=modes,
        reference={},
        sharding={},
        timing=TimingResult("skip", "not reached"),
    )
    records = records_from_results(written(tmp_path, result))
    assert [r.status for r in records.correctness] == [CorrectnessStatus.SKIP] * 2
    assert {r.workload.name for r in records.correctness} == {"xlnet_tp@tp3"}
    assert records.problems == ()
    assert records.skip_reason == f"eager: {why}; inductor: {why}"


def test_some_modes_skipping_do_not_skip_the_test(tmp_path: Path) -> None:
    result = run_result(device="cpu")
    result.modes = {
        "eager": result.modes["eager"],
        "pt2cg": ModeResult(
            "pt2cg", CorrectnessStatus.SKIP, "no CUDA device: pt2cg replays CUDA graphs", "pt2cg"
        ),
    }
    records = records_from_results(written(tmp_path, result))
    assert records.problems == () and records.skip_reason is None
    assert {r.mode: r.reason for r in records.correctness}[
        "pt2cg"
    ] == "no CUDA device: pt2cg replays CUDA graphs"


def test_an_unknown_status_is_fail_to_run_and_a_failed_sharding_check_fails_the_test(tmp_path: Path) -> None:
    data = written(
        tmp_path, run_result(sharding={"status": "fail_accuracy", "why": "rank 1: off", "checks": []})
    )
    data["modes"]["eager"]["status"] = "exploded"  # type: ignore[index]
    records = records_from_results(data)
    eager = next(r for r in records.correctness if r.mode == "eager")
    assert eager.status is CorrectnessStatus.FAIL_TO_RUN and "unknown status 'exploded'" in (
        eager.reason or ""
    )
    assert "sharding check: fail_accuracy: rank 1: off" in records.problems
    assert any(p.startswith("eager: fail_to_run: unknown status") for p in records.problems)


def test_deciding_check_is_the_worst_status_then_the_largest_ratio() -> None:
    picked = deciding_check(
        {
            "inputs": [{"rank": 0, "status": "pass", "figures": {"tol_ratio": 0.9}}],
            "moved_inputs": [{"rank": 1, "status": "fail_accuracy", "figures": {"tol_ratio": None}}],
        }
    )
    assert picked is not None and picked["rank"] == 1
    assert deciding_check({}) is None


# --- launch failures ----------------------------------------------------------------------------------


def spec_for(tmp_path: Path, **overrides: object) -> TPLaunch:
    values: dict[str, object] = {
        "workload": "mlp_decode_tp", "world_size": 2, "device": "cpu", "tier": "smoke",
        "modes": ("eager", "grace"), "samples": 0, "out": tmp_path / "out", "timeout_s": 60.0,
    }  # fmt: skip
    values.update(overrides)
    return TPLaunch(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Scripted(TPLaunch):
    """A launch whose command is a short Python script instead of torchrun."""

    script: str = "pass"

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


def test_a_launcher_that_does_not_exist_is_one_fail_to_run_record_per_mode(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, launcher="suites.tp.no_such_launcher")
    outcome = launch(spec)
    assert outcome.data is None and outcome.returncode not in (0, None)
    assert outcome.problem is not None
    assert outcome.problem.startswith("suites.tp.no_such_launcher exited ")
    assert "No module named suites.tp.no_such_launcher" in outcome.problem
    assert sys.prefix not in outcome.problem and "<env>" in outcome.problem  # the interpreter's path
    records = records_from_launch(outcome, workload_ref("mlp_decode_tp", 2, "smoke", "abc"), spec.modes)
    assert [(r.mode, r.status) for r in records.correctness] == [
        ("eager", CorrectnessStatus.FAIL_TO_RUN),
        ("grace", CorrectnessStatus.FAIL_TO_RUN),
    ]
    first = records.correctness[0]
    assert first.workload.name == "mlp_decode_tp@tp2" and first.workload.tags == ("tp",)
    assert first.reason == f"TP launch failed: {outcome.problem}"
    assert first.details["launch"]["command"].startswith("<env>")
    assert str(tmp_path) not in first.details["launch"]["command"]
    assert records.performance == () and records.problems == (f"TP launch failed: {outcome.problem}",)


def test_a_run_that_hangs_is_ended_at_the_timeout(tmp_path: Path) -> None:
    spec = Scripted(**vars(spec_for(tmp_path, timeout_s=1.0)), script="import time; time.sleep(120)")
    outcome = launch(spec)
    assert outcome.data is None and outcome.returncode is None and outcome.duration_s < 60
    assert outcome.problem is not None and outcome.problem.startswith("timed out after 1 s (--tp-timeout-s)")


def test_a_run_without_a_readable_results_file_is_a_launch_failure(tmp_path: Path) -> None:
    spec = Scripted(**vars(spec_for(tmp_path)))
    outcome = launch(spec)
    assert outcome.returncode == 0 and outcome.data is None
    assert outcome.problem == "the run wrote no results file <out>/mlp_decode_tp-tp2-cpu.json"
    spec.results_file.write_text("{not json")
    outcome = launch(spec)
    assert outcome.problem is not None and outcome.problem.startswith(
        "cannot read TP results <out>/mlp_decode_tp"
    )
    assert str(tmp_path) not in outcome.problem
    spec.results_file.write_text('{"format": "something-else"}')
    assert "is not a TP results file" in (launch(spec).problem or "")


def test_results_of_another_workload_are_refused(tmp_path: Path) -> None:
    spec = Scripted(**vars(spec_for(tmp_path, workload="xlnet_tp")))
    write_results(run_result(device="cpu", world=4), spec.out)
    (spec.out / "xlnet_tp-tp4-cpu.json").rename(spec.results_file)
    outcome = launch(spec)
    assert outcome.data is None and "holds ('xlnet_tp', 4), not ('xlnet_tp', 2)" in (outcome.problem or "")


def test_results_written_before_a_non_zero_exit_are_kept_and_fail_the_test(tmp_path: Path) -> None:
    spec = Scripted(
        **vars(spec_for(tmp_path, workload="xlnet_tp")),
        script="import sys; print('bye', file=sys.stderr); sys.exit(3)",
    )
    write_results(run_result(device="cpu"), spec.out)
    outcome = launch(spec)
    assert outcome.data is not None and outcome.returncode == 3
    records = records_from_launch(outcome, workload_ref("xlnet_tp", 2, "smoke", ""), spec.modes)
    assert {r.mode for r in records.correctness} == {"eager", "inductor", "pt2cg", "grace"}
    assert records.problems[0] == f"{spec.launcher} exited 3 after writing its results: bye"
    assert records.correctness[0].details["launch"]["exit_status"] == 3


TORCHRUN_SUMMARY = """Traceback (most recent call last):
  File "<env>/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
suites.tp.run FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 15441)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 15440)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 15440
======================================================="""


def test_a_failed_rank_is_quoted_in_its_own_words_not_torchruns_traceback(tmp_path: Path) -> None:
    script = f"import sys; print({TORCHRUN_SUMMARY!r}, file=sys.stderr); sys.exit(1)"
    spec = Scripted(**vars(spec_for(tmp_path, workload="xlnet_tp")), script=script)
    rank0 = spec.rank_logs / "job_x" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    (rank0 / "stderr.log").write_text("[tp rank 0] INFO suites.tp.run: ok\nterminate called after throwing\n")
    write_results(run_result(device="cpu"), spec.out)
    problem = launch(spec).problem or ""
    assert problem.startswith(f"{spec.launcher} exited 1 after writing its results: rank 0 failed first")
    assert "(exit code -6, SIGABRT); its last lines:" in problem and "terminate called" in problem
    assert "ChildFailedError" not in problem
    assert rank_failure("no summary here", spec.rank_logs) is None
    (rank0 / "stderr.log").write_text("")
    assert rank_failure(TORCHRUN_SUMMARY, spec.rank_logs) == (
        "rank 0 failed first (exit code -6, SIGABRT); it printed nothing to stderr"
    )


def test_launcher_failure_records_name_the_reason_for_every_mode() -> None:
    ref = workload_ref("xlnet_tp", 4, "standard", "")
    records = launcher_failure_records(ref, ["inductor", "pt2cg"], "gloo is not available", {"launch_s": 0.0})
    assert [r.reason for r in records.correctness] == ["TP launch failed: gloo is not available"] * 2
    assert records.correctness[0].details == {"launch": {"launch_s": 0.0}}
    assert records.skip_reason is None


def test_the_command_and_environment_of_a_launch(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, device="cuda", samples=30, timeout_s=600.0)
    command = spec.command()
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[3:6] == ["--standalone", "--nproc-per-node", "2"]
    assert command[command.index("--log-dir") + 1] == str(spec.rank_logs) and "--tee" in command
    assert command[command.index("-m", 3) + 1] == "suites.tp.run"
    assert command[command.index("--modes") + 1] == "eager,grace"
    assert command[command.index("--timeout-s") + 1] == "570"  # the group times out before the launch
    env = spec.environment({"NCCL_NVLS_ENABLE": "1", "PYTHONPATH": "elsewhere"})
    assert {k: env[k] for k in NO_MULTICAST} == NO_MULTICAST  # forced, whatever the caller set
    assert env["PYTHONPATH"] == os.pathsep.join([str(PACKAGE_ROOT), "elsewhere"])
    assert "OMP_NUM_THREADS" not in env
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert spec_for(tmp_path).environment({})["OMP_NUM_THREADS"] == "1"


def test_redactor_replaces_whole_path_prefixes_only(tmp_path: Path) -> None:
    redactor = Redactor({"/data/out": "<out>", "/data": "<data>"})
    text = "/data/out/x.json /data/out2/y /database (/data)"
    assert redactor.text(text) == "<out>/x.json <data>/out2/y /database (<data>)"
    assert redactor.value({"a": ["/data/out/f"], "b": 1}) == {"a": ["<out>/f"], "b": 1}
    launch_redactor = Redactor.for_launch(spec_for(tmp_path))
    text = f"{tmp_path}/out/x.json {sys.prefix}/bin/python {tempfile.gettempdir()}/torchelastic_1/error.json"
    assert launch_redactor.text(text) == "<out>/x.json <env>/bin/python <tmp>/torchelastic_1/error.json"


def test_outcome_without_results_or_problem_still_fails() -> None:
    outcome = LaunchOutcome(None, None, 0, 0.0, "cmd")
    records = records_from_launch(outcome, workload_ref("x", 2, "smoke", ""), ["eager"])
    assert records.problems == ("TP launch failed: no results",)


# --- options ------------------------------------------------------------------------------------------


def test_tp_sizes_parse_and_default() -> None:
    assert parse_tp_sizes("auto") is None
    assert parse_tp_sizes("4, 2,2") == (2, 4)
    for bad in ("two", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"TP sizes|comma list"):
            parse_tp_sizes(bad)
    assert default_tp_sizes("cpu", 0) == CPU_TP_SIZES == (2,)
    assert default_tp_sizes("cuda", 1) == ()
    assert default_tp_sizes("cuda", 2) == (2,)
    assert default_tp_sizes("cuda", 8) == (2, 4, 8)
    assert default_tp_sizes("cuda", 6) == (2, 4)


def test_the_tp_suite_collects_one_test_per_workload_and_size() -> None:
    pytest.importorskip("torch")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--collect-only",
        "-q",
        "suites/test_tp.py",
    ]
    cmd += ["--suite-device", "cpu", "--tp-sizes", "4,2", "--workloads", "mlp*"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids == [
        "suites/test_tp.py::test_tp[mlp_decode_tp-tp2]",
        "suites/test_tp.py::test_tp[mlp_decode_tp-tp4]",
    ]
    bad = subprocess.run(
        [*cmd[:-6], "--tp-sizes", "two"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "--tp-sizes" in bad.stderr


# --- the one real launch ------------------------------------------------------------------------------

GLOO_START_FAILURES = ("init_process_group", "Gloo connectFullMesh", "Address already in use", "EADDRINUSE")


@pytest.mark.slow
def test_tp2_on_cpu_gives_passing_and_skipped_records(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spec = spec_for(tmp_path, modes=("eager", "pt2cg", "grace"), timeout_s=240.0)
    outcome = launch(spec)
    if outcome.data is None and any(s in (outcome.problem or "") for s in GLOO_START_FAILURES):
        pytest.skip(f"gloo could not start two processes here: {outcome.problem}")
    records = records_from_launch(outcome, workload_ref("mlp_decode_tp", 2, "smoke", ""), spec.modes)
    assert records.problems == (), records.problems
    statuses = {r.mode: r.status for r in records.correctness}
    assert statuses == {"eager": "pass", "pt2cg": "skip", "grace": "pass"}
    grace = next(r for r in records.correctness if r.mode == "grace")
    assert grace.workload.name == "mlp_decode_tp@tp2" and grace.workload.code_hash
    assert (grace.details["world_size"], grace.details["backend"], grace.details["runs_as"]) == (
        2,
        "gloo",
        "grace-cpu",
    )
    assert records.performance == () and records.skip_reason is None
    assert str(tmp_path) not in repr(records.all)
