"""Diagnostic: why a training backward under grace writes its saved tensors after mode inductor ran.

In the suites, modes compile one after another in one process (suites.harness: Dynamo is reset only
between workloads). Where mode inductor compiled a training workload before grace, grace's backward
wrote some of its saved tensors on its first run (grace records ``unlisted_write``); where it did not,
no write was seen. This script runs one workload's training step in a sequence of modes within one
process, per case in a fresh subprocess, and records for every Inductor graph lowering: forward or
backward, the donated backward inputs it was given (``bw_donated_idxs``), AOTAutograd's and Inductor's
relevant config at that moment, and the FX graph cache counters; and for grace, each slot's skips.

Cases (``--cases``, each ``label=mode,mode[;setting]``): the modes run in order on deep copies of one
model, three steps each, with no reset in between. Settings: ``donated_off`` turns AOTAutograd's
donated buffers off for the whole process; ``reset`` resets Dynamo between modes; ``harness`` takes the
suites' own path (references, each mode's warm-up and correctness trace, then interleaved steps);
``cache=LABEL`` runs with the Inductor cache folder case LABEL left behind (each case has a fresh one
otherwise).

Run from the repository root: ``python scripts/gpu/write_probe.py --out DIR --workload NAME``.
Writes ``write_probe.json`` under ``--out`` after every case.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_CASES = (
    "suite_order=inductor,pt2cg,grace;harness",
    "suite_pt2cg_grace=pt2cg,grace;harness",
    "ind_grace=inductor,grace",
    "grace_only=grace",
    "ind_grace_nodonate=inductor,grace;donated_off",
    "grace_on_ind_cache=grace;cache=ind_grace",
    "ind_grace_reset=inductor,grace;reset",
    "pt2cg_grace=pt2cg,grace",
    "ind_pt2cg_grace=inductor,pt2cg,grace",
)


def _lowering_log(events: list[dict[str, Any]], mode: list[str]) -> None:
    """Record every GraphLowering made from now on (Inductor's compile of one graph)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.graph import GraphLowering

    original = GraphLowering.__init__

    def logged(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        events.append(
            {
                "mode": mode[0],
                "is_backward": bool(kwargs.get("is_backward", getattr(self, "is_backward", False))),
                "bw_donated_idxs": list(getattr(self, "bw_donated_idxs", None) or []),
                "functorch_donated_buffer": bool(getattr(functorch_config, "donated_buffer", None)),
                "fx_graph_cache": bool(getattr(inductor_config, "fx_graph_cache", None)),
                "placeholders": sum(1 for n in self.orig_gm.graph.nodes if n.op == "placeholder")
                if getattr(self, "orig_gm", None) is not None
                else None,
            }
        )

    GraphLowering.__init__ = logged  # type: ignore[method-assign]


def run_case(workload: str, modes: list[str], settings: set[str], device: str) -> dict[str, Any]:
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    import grace
    from suites.modes import Mode
    from suites.tensors import clone_inputs
    from suites.training import TrainStep
    from suites.workloads import get

    if "donated_off" in settings:
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
    events: list[dict[str, Any]] = []
    current = ["?"]
    _lowering_log(events, current)
    if "harness" in settings:
        found = _harness_case(workload, modes, device, current)
        found["lowerings"] = events
        return found
    model, inputs = get(workload).factory("standard")(torch.device(device), torch.float32)
    inputs = clone_inputs(tuple(inputs))
    out: dict[str, Any] = {"modes": {}}
    for name in modes:
        current[0] = name
        if "reset" in settings:
            torch._dynamo.reset()
        before = dict(counters["inductor"])
        grace.stats.reset()
        step = TrainStep(Mode(name), copy.deepcopy(model), device)
        losses = []
        with torch.no_grad():
            for _ in range(3):
                losses.append(float(step(*clone_inputs(inputs))))
        if device == "cuda":
            torch.cuda.synchronize()
        after = dict(counters["inductor"])
        skips = _unlisted_writes()
        out["modes"][name] = {
            "losses": losses,
            "cache": {k: after.get(k, 0) - before.get(k, 0) for k in after if "cache" in k},
            "unlisted_writes": skips,
        }
        del step
    out["lowerings"] = events
    return out


def _unlisted_writes() -> list[tuple[Any, str, str]]:
    import grace

    return [
        (r.get("graph_id"), s["code"], s["detail"][:300])
        for r in grace.stats.snapshot()
        for s in r.get("skip_reasons", [])
        if s["code"] == "unlisted_write"
    ]


def _harness_case(workload: str, modes: list[str], device: str, current: list[str]) -> dict[str, Any]:
    """The suites' own path: references, then per mode its compile and warm-up and its correctness
    trace (suites.correctness), then five steps of each mode interleaved, as the timed samples run."""
    import torch
    from torch._dynamo.utils import counters

    from suites.accuracy import load_tolerances
    from suites.correctness import _evaluate_training
    from suites.harness import PreparedWorkload
    from suites.modes import Mode
    from suites.workloads import get

    prepared = PreparedWorkload(get(workload), "standard", torch.device(device), torch.float32)
    prepared.load()
    tolerances = load_tolerances()
    out: dict[str, Any] = {"modes": {}}
    for name in modes:
        current[0] = name
        before = dict(counters["inductor"])
        record = _evaluate_training(prepared, Mode(name), tolerances)
        after = dict(counters["inductor"])
        out["modes"][name] = {
            "status": str(getattr(record.status, "value", record.status)),
            "reason": str(record.reason)[:300],
            "cache": {k: after.get(k, 0) - before.get(k, 0) for k in after if "cache" in k},
            "unlisted_writes": _unlisted_writes(),
        }
    with torch.no_grad():
        for _ in range(5):
            for name in modes:
                entry = prepared.compiled_mode(Mode(name))
                if entry.fn is not None:
                    entry.fn(*entry.inputs)
    out["after_samples"] = _unlisted_writes()
    prepared.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workload", default="nvidia_deeprecommender_train")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", default=";;".join(DEFAULT_CASES), help="cases separated by ';;'")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process: label=modes;set
    parser.add_argument("--timeout-s", type=float, default=150.0)
    args = parser.parse_args()
    if args.case:
        _, _, spec = args.case.partition("=")
        modes_text, *settings = spec.split(";")
        found = run_case(args.workload, modes_text.split(","), set(settings), args.device)
        print(json.dumps(found, default=str))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "write_probe.json"
    results: dict[str, Any] = {"workload": args.workload}
    caches = Path(tempfile.mkdtemp(prefix="write-probe-"))  # kept out of --out: the caches are large
    for case in args.cases.split(";;"):
        label = case.partition("=")[0]
        settings = case.partition("=")[2].split(";")[1:]
        cache = next((s.partition("=")[2] for s in settings if s.startswith("cache=")), label)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / cache)}
        t0 = time.monotonic()
        cmd = [sys.executable, __file__, "--out", str(args.out), "--workload", args.workload]
        cmd += ["--device", args.device, "--case", case]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, env=env)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            value: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": done.stderr[-3000:]}
        except subprocess.TimeoutExpired:
            value = {"error": "timeout"}
        value["seconds"] = round(time.monotonic() - t0, 1)
        results[label] = value
        path.write_text(json.dumps(results, indent=1, default=str))
        summary = {m: (len(v["unlisted_writes"]), v["cache"]) for m, v in value.get("modes", {}).items()}
        donated = [
            (e["mode"], e["bw_donated_idxs"][:12]) for e in value.get("lowerings", []) if e["is_backward"]
        ]
        print(f"{label}: {value['seconds']}s writes/cache {summary} bw donated {donated}", flush=True)
        if "error" in value:
            print(value["error"][-1500:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
