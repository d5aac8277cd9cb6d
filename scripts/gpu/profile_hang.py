"""Diagnostic: which profiler settings make a training step under grace hang, each case in its own process.

MT5 training with its backward in a graph (``scg_margin`` 0.01) never returned from
``torch.cuda.synchronize()`` after one step run under ``torch.profiler`` with CPU and CUDA activities
(docs/design/training.md). A hang cannot be interrupted from Python, so every case runs in a child
process with a time limit: the child builds the workload's ``suites.training.TrainStep`` for one mode
(``grace:key=value,...`` as in train_memory.py), runs ``--warmup`` steps (the deciding calls among
them), then one step under the profiler with the case's activities, and prints one JSON line; a child
past the limit is killed and counts as hung (its Python stacks, dumped by faulthandler shortly before,
are kept with the result).

Run from the repository root: ``python scripts/gpu/profile_hang.py --out DIR --workload NAME
--modes M;N --activities cpu+cuda,cuda,cpu``. Writes ``profile_hang.json`` under ``--out`` after each
case.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ACTIVITIES = ("cpu", "cuda")


def child(workload: str, mode_text: str, activities: str, warmup: int, dump_after_s: float) -> int:
    import faulthandler

    import torch
    from probe import graphs  # this directory is first on the path of a script run from it
    from torch.profiler import ProfilerActivity, profile
    from train_memory import parse_mode

    from suites.modes import reset_compilers, set_grace_overrides
    from suites.tensors import clone_inputs
    from suites.training import TrainStep
    from suites.workloads import get

    faulthandler.dump_traceback_later(dump_after_s, exit=False)
    reset_compilers()
    mode, overrides = parse_mode(mode_text)
    set_grace_overrides(overrides)
    model, inputs = get(workload).factory("standard")(torch.device("cuda"), torch.float32)
    inputs = clone_inputs(tuple(inputs))
    step = TrainStep(mode, model, "cuda")
    chosen = [getattr(ProfilerActivity, a.upper()) for a in activities.split("+") if a]
    with torch.no_grad():  # as the suites call a step (it enables gradients itself)
        for _ in range(warmup):
            step(*inputs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=chosen):
            step(*inputs)
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    faulthandler.cancel_dump_traceback_later()
    found = graphs() if mode.value != "pt2cg" else []
    print(json.dumps({"ok": True, "profiled_step_s": round(seconds, 3), "graphs": found}, default=str))
    return 0


def run_case(args: argparse.Namespace, mode_text: str, activities: str) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--child",
        "--workload",
        args.workload,
        "--modes",
        mode_text,
        "--activities",
        activities,
        "--warmup",
        str(args.warmup),
        "--dump-after-s",
        str(max(5.0, args.limit_s - 15)),
    ]
    case: dict[str, Any] = {"mode": mode_text, "activities": activities}
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.limit_s)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        case.update(outcome="hung", stacks=stderr[-6000:])
    else:
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode == 0 and lines:
            case.update(outcome="ok", **json.loads(lines[-1]))
        else:
            case.update(outcome=f"exit {done.returncode}", stderr=done.stderr[-6000:])
    case["seconds"] = round(time.perf_counter() - start, 1)
    return case


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--workload", default="MT5ForConditionalGeneration_train")
    parser.add_argument("--modes", default="grace:scg_margin=0.01;grace")
    parser.add_argument("--activities", default="cpu+cuda,cuda,cpu")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--limit-s", type=float, default=150.0)
    parser.add_argument("--dump-after-s", type=float, default=135.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.workload, args.modes, args.activities, args.warmup, args.dump_after_s)
    if args.out is None:
        parser.error("--out is required")
    for part in args.activities.split(","):
        if any(a not in ACTIVITIES for a in part.split("+")):
            parser.error(f"--activities: {part!r} is not a '+'-joined choice of {', '.join(ACTIVITIES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for mode_text in [m for m in args.modes.split(";") if m]:
        for activities in args.activities.split(","):
            results.append(run_case(args, mode_text, activities))
            print(json.dumps({k: v for k, v in results[-1].items() if k not in ("stacks", "stderr")}))
            (args.out / "profile_hang.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
