"""Diagnostic: where a training step's memory goes, phase by phase, in pt2cg and grace variants.

For each training workload (standard tier) and mode, a ``suites.training.TrainStep`` runs ``--calls``
iterations inside the suites' memory window (suites.harness.memory_window_base). Per call it records the
peak and the allocated bytes above the window's base at the end of each phase (forward, backward,
optimizer step), and after the last call the allocated and reserved bytes of every memory pool
(``torch.cuda.memory_snapshot``: the default pool and each graph's private pool) and grace's graphs
(variant, calls, held-output calls, output bytes held); with ``--decide-memory``, each deciding call's
memory stage by stage (decide_memory.py). A mode is ``pt2cg``, ``grace`` or
``grace:key=value,...`` (GraceOptions overrides, values read as ``--grace-option`` reads them:
``grace:max_output_sets=16``).

Run from the repository root: ``python scripts/gpu/train_memory.py --out DIR --workloads A,B --modes "M;N"``
(modes apart by semicolons: a mode's options are apart by commas).
Writes ``train_memory.json`` under ``--out`` after every mode.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import decide_memory  # this directory is first on the path of a script run from it
import pool_trace
import torch
from probe import graphs

import grace
import grace.compat.torch
import grace.poolgroups
import grace.pools
from suites.harness import memory_window_base
from suites.modes import Mode, reset_compilers, set_grace_overrides
from suites.options import parse_grace_options
from suites.tensors import clone_inputs
from suites.training import TrainStep
from suites.workloads import get

MIB = 1 << 20


def parse_mode(text: str) -> tuple[Mode, dict[str, Any]]:
    """``grace:key=value,...`` -> the mode and its GraceOptions overrides (as ``--grace-option`` reads
    them)."""
    name, _, rest = text.partition(":")
    return Mode(name), dict(parse_grace_options([item for item in rest.split(",") if item]))


def pools() -> dict[str, dict[str, float]]:
    """Allocated and reserved MiB per memory pool (``(0, 0)`` is the caching allocator's own)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"allocated_mib": 0.0, "reserved_mib": 0.0})
    for seg in torch.cuda.memory_snapshot():
        entry = out[str(seg.get("segment_pool_id", "?"))]
        entry["allocated_mib"] += seg["allocated_size"] / MIB
        entry["reserved_mib"] += seg["total_size"] / MIB
    return {k: {f: round(v, 1) for f, v in e.items()} for k, e in out.items()}


class PhaseMeter:
    """Peak and allocated MiB above ``base`` at each phase boundary of one iteration, and the peak the
    caching allocator reserved in that phase (all of it: graph pools whole, cached blocks included)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.marks: list[dict[str, Any]] = []

    def mark(self, phase: str) -> None:
        torch.cuda.synchronize()
        self.marks.append(
            {
                "phase": phase,
                "peak_mib": round((torch.cuda.max_memory_allocated() - self.base) / MIB, 1),
                "allocated_mib": round((torch.cuda.memory_allocated() - self.base) / MIB, 1),
                "reserved_peak_mib": round(torch.cuda.max_memory_reserved() / MIB, 1),
            }
        )
        torch.cuda.reset_peak_memory_stats()


def instrument(step: TrainStep, meter: PhaseMeter) -> None:
    forward, opt_step = step.forward, step.optimizer.step

    def measured_forward(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        meter.mark("forward")
        return out

    def measured_step(*args: Any, **kwargs: Any) -> Any:
        meter.mark("backward")
        out = opt_step(*args, **kwargs)
        meter.mark("optimizer")
        return out

    step.forward = measured_forward
    step.optimizer.step = measured_step  # type: ignore[method-assign]


def fresh_workload(name: str, mode_text: str) -> tuple[Mode, Any, tuple[Any, ...]]:
    """The mode of ``mode_text`` (its grace overrides set), and a fresh model and inputs of workload
    ``name`` at the standard tier on the GPU."""
    mode, overrides = parse_mode(mode_text)
    set_grace_overrides(overrides)
    model, inputs = get(name).factory("standard")(torch.device("cuda"), torch.float32)
    return mode, model, clone_inputs(tuple(inputs))


def one(name: str, mode_text: str, calls: int) -> dict[str, Any]:
    reset_compilers()
    grace.stats.reset()
    mode, model, inputs = fresh_workload(name, mode_text)
    base = memory_window_base(torch.device("cuda"))
    step = TrainStep(mode, model, "cuda")
    meter = PhaseMeter(base)
    instrument(step, meter)
    per_call = []
    decide_memory.BASE = base
    with torch.no_grad():
        for index in range(calls):
            pool_trace.STEP = decide_memory.STEP = index + 1
            t0 = time.perf_counter()
            loss = step(*inputs)
            del loss
            meter.mark("end")
            per_call.append({"seconds": round(time.perf_counter() - t0, 3), "marks": meter.marks})
            meter.marks = []
    result = {
        "per_call": per_call,
        "pools": pools(),
        "graphs": graphs() if mode is not Mode.PT2CG else [],
        "pools_waiting": grace.pools.waiting(),
        "step_pool": step_pool_seats() if mode is not Mode.PT2CG else [],
        "pool_trace": pool_trace.events(),
        "decide_memory": decide_memory.events(),
    }
    del step, model, inputs
    forget_compiled()
    return result


def _mib(spans: Any) -> float:
    return round(sum(end - start for start, end in spans or ()) / MIB, 2)


def step_pool_seats() -> list[dict[str, Any]]:
    """The step pool's members after the last call (Note: [A training step in one pool]): each one's
    capture order, slot, footprint and outputs (MiB), whether it lent its outputs and which of them are
    held now, and every member whose outputs its footprint meets, with the overlap in MiB."""
    out: list[dict[str, Any]] = []
    for group in grace.poolgroups.step_groups():
        for seat in group.seats():
            family = seat.graph.family
            refs = [grace.compat.torch.storage_use_count(ref) - own for ref, own in family.refs]
            out.append(
                {
                    "order": seat.order,
                    "graph_id": getattr(seat.kin, "graph_id", None),
                    "footprint_mib": None if seat.footprint is None else _mib(seat.footprint),
                    "outputs_mib": _mib(seat.outputs),
                    "lent": bool(family.owners),
                    "kept": list(family.kept),
                    "held_beyond_own": refs,
                    "owners_alive": [
                        None if o is None else grace.compat.torch.storage_use_count(o) for o in family.owners
                    ],
                    "overwrites": [
                        {
                            "order": other.order,
                            "graph_id": getattr(other.kin, "graph_id", None),
                            "overlap_mib": _mib(grace.poolgroups.intersection(seat.footprint, other.outputs))
                            if seat.footprint is not None
                            else None,
                        }
                        for other in (over.seat for over in seat.overwrites)
                    ],
                }
            )
    return out


def forget_compiled() -> None:
    """Drop every compiled artefact, the grace overrides and the device memory they held."""
    set_grace_overrides({})
    reset_compilers()
    gc.collect()
    torch.cuda.empty_cache()


def environment() -> dict[str, Any]:
    """The first entry of a probe's results: torch's version and the GPU."""
    return {"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}}


def record_entry(
    results: dict[str, Any], key: str, path: Path, deadline: float, run: Callable[[], dict[str, Any]]
) -> dict[str, Any] | None:
    """``run()`` as ``results[key]`` (its error and trace where it raises), with its seconds, and
    ``results`` written to ``path``; past ``deadline`` only a deadline error, and None."""
    if time.monotonic() > deadline:
        results[key] = {"error": "deadline"}
        return None
    t0 = time.monotonic()
    try:
        value = run()
    except Exception as exc:
        value = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    value["seconds"] = round(time.monotonic() - t0, 1)
    results[key] = value
    path.write_text(json.dumps(results, indent=1, default=str))
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default="DistilGPT2_train,MT5ForConditionalGeneration_train")
    parser.add_argument("--modes", default="pt2cg;grace;grace:max_output_sets=16")
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--trace", action="store_true", help="record the step pool's timeline (pool_trace)")
    parser.add_argument("--decide-memory", action="store_true", help="each deciding call's memory by stage")
    args = parser.parse_args()
    if args.trace:
        pool_trace.install()
    if args.decide_memory:
        decide_memory.install()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    results = environment()
    path = args.out / "train_memory.json"
    for name in args.workloads.split(","):
        for mode in args.modes.split(";"):
            key = f"{name}/{mode}"
            value = record_entry(results, key, path, deadline, functools.partial(one, name, mode, args.calls))
            if value is None:
                continue
            ends = [c["marks"][-1]["allocated_mib"] for c in value.get("per_call", [])]
            peaks = [max(m["peak_mib"] for m in c["marks"]) for c in value.get("per_call", [])]
            print(f"{key}: peaks {peaks} end-allocated {ends}", value.get("error", ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
