"""Run the TP workloads in every mode on every rank: ``torchrun --nproc-per-node N -m suites.tp.run``.

Problem: the paper's TP results (XLNet at TP-4) need one process per GPU, each running its shard of the
model in each mode, with every rank's output judged against the unsharded model and the modes timed
against each other in one run; on a CPU machine the same code must run with gloo so that the harness
and the sharding are tested before a multi-GPU machine is lent.

Design, per workload (all ranks run the same sequence of collectives):
1. build the unsharded model on the CPU from a fixed seed, move it to this rank's device, overwrite it
   with rank 0's weights (broadcast); inputs likewise. Derive the float64 model and the model in the run
   dtype from it; shard each (``TPWorkload.shard``).
2. references on every rank: unsharded eager run twice (must agree), unsharded float64; the *sharding*
   check compares TP eager in float64 with unsharded float64 (float64 tolerances).
3. each mode: a fresh shard of the reference, built with ``suites.modes.build`` (``grace`` through
   ``grace.compile(model, options=grace.GraceOptions())``); warm-up calls, then checks on the inputs, on
   new inputs at new addresses and on the inputs again, each judged by ``suites.accuracy`` against the
   unsharded eager output with the float64 fallback rule and the tolerances of suites/tolerances.toml.
   Every rank's verdicts and errors are gathered; the mode's status is the worst rank's.
4. on CUDA with ``--samples`` > 0: modes that ran are timed interleaved with CUDA events
   (suites.timing) on every rank; a step's latency is the slowest rank's sample (the collectives
   synchronise the ranks); medians and speedups vs inductor and pt2cg come from this run only.
5. rank 0 writes one JSON file per workload (suites.tp.results).

Modes on a CPU: eager, inductor, and grace as grace's no-CUDA path (``runs_as`` says ``grace-cpu``);
pt2cg and the other graph modes are recorded as ``skip`` with the reason. On CUDA each rank uses
``cuda:LOCAL_RANK`` (set as the current device) and NCCL.

Invariant: a failure of one mode becomes its status and error text; the run goes on. Caveat: a mode
that fails on some ranks only, in the middle of a forward, leaves the others waiting in a collective
until ``--timeout-s`` (the process group's timeout) ends the run.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import logging
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from suites import grace_stats
from suites.accuracy import Tolerance, compare, judge, load_tolerances
from suites.harness import compile_counters, describe, synchronize
from suites.modes import GRACE_MODES, Mode, ModeError, build, parse_modes, reset_compilers, unavailable_reason
from suites.records import CorrectnessStatus
from suites.tensors import Leaves, snapshot
from suites.tp.collectives import TPGroup, broadcast_from_rank0, broadcast_module_from_rank0
from suites.tp.results import ModeResult, RankCheck, TimingResult, TPRunResult, write_results
from suites.tp.workloads import INPUT_SEED, VARIANT_SEED, TPWorkload, select
from suites.workloads.registry import Tier, WorkloadError

logger = logging.getLogger("suites.tp.run")

DEFAULT_MODES = "eager,inductor,pt2cg,grace"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WARMUP_CALLS = 3  # compile + record + first replay for cudagraph trees; grace: warm-up + deciding call
PERF_WARMUP_CALLS = 5
EXIT_OK, EXIT_USAGE, EXIT_INTERNAL = 0, 2, 3
STEP_RULE = "step_ms[i] = max over ranks of sample i (the collectives synchronise the ranks)"
_SEVERITY = {CorrectnessStatus.PASS: 0, CorrectnessStatus.FAIL_ACCURACY: 1, CorrectnessStatus.FAIL_TO_RUN: 2}


class UsageError(Exception):
    """A command line or environment that cannot run (exit 2)."""


@dataclass(frozen=True)
class Context:
    tp: TPGroup
    device: torch.device
    backend: str
    dtype: torch.dtype
    tier: Tier
    warmup: int
    samples: int
    out: Path
    command: str


# --- setup -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m suites.tp.run", description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="all", help="comma list of TP workloads, or 'all'")
    parser.add_argument(
        "--modes", default=DEFAULT_MODES, help=f"comma list of modes (default {DEFAULT_MODES})"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--tier", choices=[t.value for t in Tier], default=Tier.SMOKE.value)
    parser.add_argument("--samples", type=int, default=30, help="timed calls per mode (CUDA only; 0: none)")
    parser.add_argument("--warmup", type=int, default=WARMUP_CALLS, help="calls per mode before the checks")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"), help="results folder (default $OUT)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="process group timeout")
    return parser.parse_args(argv)


def init_distributed(device_type: str, timeout_s: float) -> tuple[TPGroup, torch.device, str]:
    missing = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if name not in os.environ]
    if missing:
        raise UsageError(
            f"{', '.join(missing)} not set: launch with torchrun --nproc-per-node N -m suites.tp.run ..."
        )
    rank, world, local = (int(os.environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device_type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
            raise UsageError(
                f"--device cuda: rank {rank} needs cuda:{local} but {torch.cuda.device_count()} CUDA "
                "device(s) are visible; use fewer processes or --device cpu"
            )
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return TPGroup(rank=rank, world_size=world, group=dist.group.WORLD), device, backend


def plan_mode(mode: Mode, device_type: str) -> tuple[Mode, str | None]:
    """The suites mode that runs ``mode`` here and why it cannot run (None when it can).

    ``grace`` on a CPU runs as ``grace-cpu``: grace.compile takes its no-graph path there.
    """
    runs_as = Mode.GRACE_CPU if (mode is Mode.GRACE and device_type != "cuda") else mode
    return runs_as, unavailable_reason(runs_as, device_type)


def gather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (eager all_gather_object)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


# --- checks ------------------------------------------------------------------------------------------


@dataclass
class References:
    inputs: tuple[torch.Tensor, ...]
    moved: tuple[torch.Tensor, ...]
    eager: Leaves
    eager_moved: Leaves
    fp64: Leaves
    fp64_moved: Leaves


def check(
    result: Leaves, reference: Leaves, tolerance: Tolerance, fp64: Leaves | None, rank: int
) -> RankCheck:
    figures = compare(result, reference, tolerance, fp64)
    status, why = judge(figures, tolerance)
    return RankCheck(rank=rank, status=status.value, why=why, figures=figures.to_dict())


def worst(checks: Sequence[RankCheck]) -> tuple[CorrectnessStatus, str]:
    """The worst verdict over ranks and input sets, with the first reason that led to it."""
    status = CorrectnessStatus.PASS
    why = f"{len(checks)} rank checks pass (rank {checks[0].rank}: {checks[0].why})" if checks else ""
    for c in checks:
        s = CorrectnessStatus(c.status)
        if _SEVERITY.get(s, 2) > _SEVERITY[status]:
            status, why = s, f"rank {c.rank}: {c.why}"
    return status, why


def run_mode(
    wl: TPWorkload, mode: Mode, reference: torch.nn.Module, refs: References, tol: Tolerance, ctx: Context
) -> tuple[ModeResult, Callable[[], Any] | None]:
    """One mode on every rank: its gathered result and (where every rank ran it) the call to time."""
    runs_as, skip = plan_mode(mode, ctx.device.type)
    if skip is not None:
        return ModeResult(mode.value, CorrectnessStatus.SKIP, skip, runs_as.value), None
    local: dict[str, Any] = {"checks": {}, "error": None, "compile_s": None, "graphs": None}
    before = grace_stats.graph_keys() if runs_as in GRACE_MODES else None
    counters = compile_counters()
    fn: Callable[..., Any] | None = None
    try:
        with torch.no_grad():
            fn = build(runs_as, wl.shard(reference, ctx.tp))
            synchronize(ctx.device)
            t0 = time.perf_counter()
            fn(*refs.inputs)
            synchronize(ctx.device)
            local["compile_s"] = time.perf_counter() - t0
            for _ in range(ctx.warmup - 1):
                fn(*refs.inputs)
            runs = {
                "inputs": (snapshot(fn(*refs.inputs)), refs.eager, refs.fp64),
                "moved_inputs": (snapshot(fn(*refs.moved)), refs.eager_moved, refs.fp64_moved),
                "inputs_again": (snapshot(fn(*refs.inputs)), refs.eager, refs.fp64),
            }
        rank = ctx.tp.rank
        local["checks"] = {name: check(out, ref, tol, fp64, rank) for name, (out, ref, fp64) in runs.items()}
    except Exception as exc:
        local["error"] = describe(exc)
        logger.warning("%s/%s failed on rank %d: %s", wl.name, mode.value, ctx.tp.rank, local["error"])
        logger.debug("%s", traceback.format_exc())
        fn = None
    local["facts"] = {k: v - counters.get(k, 0) for k, v in compile_counters().items()}
    if before is not None:
        local["graphs"] = grace_stats.select(grace_stats.snapshot(), grace_stats.graph_keys() - before)
    ranks = gather(local)
    result = ModeResult(mode.value, CorrectnessStatus.PASS, runs_as=runs_as.value)
    result.errors = {r: d["error"] for r, d in enumerate(ranks) if d["error"]}
    result.grace_graphs = {r: grace_stats.plain(d["graphs"]) for r, d in enumerate(ranks) if d["graphs"]}
    times = [d["compile_s"] for d in ranks if d["compile_s"] is not None]
    result.compile_s = max(times) if times else None
    result.compile_facts = ranks[0]["facts"]
    for name in ("inputs", "moved_inputs", "inputs_again"):
        result.checks[name] = [d["checks"][name] for d in ranks if name in d["checks"]]
    if result.errors:
        result.status = CorrectnessStatus.FAIL_TO_RUN
        first = min(result.errors)
        result.reason = f"rank {first}: {result.errors[first]}"
        return result, None
    result.status, result.reason = worst([c for checks in result.checks.values() for c in checks])
    inputs = refs.inputs
    return result, (lambda: fn(*inputs)) if fn is not None else None


# --- timing ------------------------------------------------------------------------------------------


def time_modes(calls: dict[str, Callable[[], Any]], ctx: Context) -> TimingResult:
    if ctx.device.type != "cuda":
        return TimingResult("skip", "no CUDA device: CPU timings of GPU-oriented modes would mean nothing")
    if ctx.samples <= 0 or not calls:
        return TimingResult("skip", "--samples 0" if ctx.samples <= 0 else "no mode ran on every rank")
    from suites.timing import time_interleaved

    with torch.no_grad():
        for _ in range(PERF_WARMUP_CALLS):
            for call in calls.values():
                call()
        synchronize(ctx.device)
        dist.barrier()
        samples, errors = time_interleaved(calls, ctx.samples)
    every = gather((samples, errors))
    result = TimingResult("ok", samples=ctx.samples, rule=STEP_RULE)
    for name in calls:
        result.samples_ms[name] = {r: s[name] for r, (s, _) in enumerate(every)}
        failed = {r: e[name] for r, (_, e) in enumerate(every) if name in e}
        if failed:
            result.errors[name] = "; ".join(f"rank {r}: {text}" for r, text in sorted(failed.items()))
        per_rank = list(result.samples_ms[name].values())
        n = min(len(s) for s in per_rank)
        result.step_ms[name] = [max(s[i] for s in per_rank) for i in range(n)]
        if n:
            result.median_ms[name] = float(statistics.median(result.step_ms[name]))
    for base, target in (
        (Mode.INDUCTOR.value, result.speedup_vs_inductor),
        (Mode.PT2CG.value, result.speedup_vs_pt2cg),
    ):
        if base in result.median_ms:
            for name, median in result.median_ms.items():
                target[name] = result.median_ms[base] / median if median > 0 else 0.0
    return result


# --- one workload ------------------------------------------------------------------------------------


def references(wl: TPWorkload, ctx: Context) -> tuple[torch.nn.Module, torch.nn.Module, References]:
    """(unsharded model in the run dtype, unsharded float64 model, reference outputs): rank 0's weights."""
    size = wl.size(ctx.tier)
    full = wl.build_full(size).to(ctx.device, torch.float32).requires_grad_(False)
    broadcast_module_from_rank0(full, ctx.tp.group)
    inputs = tuple(t.to(ctx.device) for t in wl.inputs(size, INPUT_SEED))
    moved = tuple(t.to(ctx.device) for t in wl.inputs(size, VARIANT_SEED))
    broadcast_from_rank0([*inputs, *moved], ctx.tp.group)
    full64 = copy.deepcopy(full).to(torch.float64)
    model = full.to(ctx.dtype)
    with torch.no_grad():
        refs = References(
            inputs=inputs,
            moved=moved,
            eager=snapshot(model(*inputs)),
            eager_moved=snapshot(model(*moved)),
            fp64=snapshot(full64(*inputs)),
            fp64_moved=snapshot(full64(*moved)),
        )
    return model, full64, refs


def run_workload(wl: TPWorkload, modes: Sequence[Mode], ctx: Context) -> TPRunResult:
    table = load_tolerances()
    tol = table.for_(str(ctx.dtype), wl.name)
    result = TPRunResult(
        workload={
            "name": wl.name,
            "tier": ctx.tier.value,
            "description": wl.description,
            "size": dict(wl.size(ctx.tier)),
            "code_hash": wl.code_hash,
        },
        world_size=ctx.tp.world_size,
        device=str(ctx.device.type),
        backend=ctx.backend,
        dtype=str(ctx.dtype).removeprefix("torch."),
        torch=torch.__version__,
        created_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=ctx.command,
        tolerance=tol.to_dict(),
        reference={},
        sharding={},
        modes={},
        timing=TimingResult("skip", "not reached"),
    )

    def all_modes(status: CorrectnessStatus, reason: str) -> TPRunResult:
        result.modes = {
            m.value: ModeResult(m.value, status, reason, plan_mode(m, ctx.device.type)[0].value)
            for m in modes
        }
        return result

    cannot = wl.check_world_size(ctx.tier, ctx.tp.world_size)
    if cannot:
        return all_modes(CorrectnessStatus.SKIP, cannot)
    try:
        model, full64, refs = references(wl, ctx)
        with torch.no_grad():
            again = snapshot(model(*refs.inputs))
            tp64 = wl.shard(full64, ctx.tp)
            sharded = snapshot(tp64(*refs.inputs))
    except Exception as exc:
        logger.warning("%s failed to load on rank %d: %s", wl.name, ctx.tp.rank, describe(exc))
        errors = gather(describe(exc))
        return all_modes(
            CorrectnessStatus.MODEL_FAIL_TO_LOAD, "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors))
        )
    rerun = check(again, refs.eager, table.rerun(), None, ctx.tp.rank)
    shard = check(sharded, refs.fp64, table.for_("float64"), None, ctx.tp.rank)
    pairs = gather((rerun, shard))
    reruns, shards = [p[0] for p in pairs], [p[1] for p in pairs]
    status, why = worst(reruns)
    result.reference = {"status": status.value, "why": why}
    status, why = worst(shards)
    result.sharding = {
        "status": status.value,
        "why": why,
        "checks": [asdict(c) for c in shards],
    }
    del full64, tp64
    calls: dict[str, Callable[[], Any]] = {}
    for mode in modes:
        mode_result, call = run_mode(wl, mode, model, refs, tol, ctx)
        result.modes[mode.value] = mode_result
        if call is not None:
            calls[mode.value] = call
        logger.info("%s %s: %s %s", wl.name, mode.value, mode_result.status.value, mode_result.reason)
    result.timing = time_modes(calls, ctx)
    return result


# --- entry point -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[tp rank {rank}] %(levelname)s %(name)s: %(message)s")
    try:
        modes = parse_modes(args.modes)
        workloads = select(args.workload)
        tp, device, backend = init_distributed(args.device, args.timeout_s)
    except (UsageError, ModeError, WorkloadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ctx = Context(
        tp=tp,
        device=device,
        backend=backend,
        dtype=DTYPES[args.dtype],
        tier=Tier(args.tier),
        warmup=max(1, args.warmup),
        samples=args.samples,
        out=Path(args.out),
        command=" ".join(
            ["torchrun", f"--nproc-per-node={tp.world_size}", "-m", "suites.tp.run", *sys.argv[1:]]
        ),
    )
    try:
        for wl in workloads:
            result = run_workload(wl, modes, ctx)
            if tp.rank == 0:
                path = write_results(result, ctx.out)
                summary = ", ".join(f"{m}={r.status.value}" for m, r in result.modes.items())
                print(f"{wl.name} TP-{tp.world_size} on {device.type}: {summary} -> {path}")
            reset_compilers()
            dist.barrier()
    except Exception:
        traceback.print_exc()
        return EXIT_INTERNAL
    finally:
        dist.destroy_process_group()
    return EXIT_OK


def exit_without_finalization(code: int) -> None:
    """End a rank's process once its results are written and its process group destroyed, without the
    interpreter's finalization: threads torch keeps (gloo's, the autograd engine's) can release Python
    objects while the interpreter is torn down, which aborts the process (SIGABRT, pytorch#190489) after
    its work is done, and torchrun then reports the whole run as failed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalization(main())
