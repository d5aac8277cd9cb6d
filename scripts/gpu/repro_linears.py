"""Repeat the ``linears_cpu_scalar`` capture test many times to catch a nondeterministic wrong result.

The model: 8 x Linear(256) whose outputs are scaled by 0-d CPU tensor attributes (they stay on the
CPU; CGCT gives the graph GPU mirrors of them). Each trial compiles afresh (``torch._dynamo.reset``,
``grace.reset``, a new model with CPU scales) and runs the call sequence of
``tests/test_capture_gpu.py::_check_model`` (same inputs 4 times, moved copy, new values, steady calls,
shape change, back), comparing every call with eager. Between calls it allocates and frees tensors of
random sizes filled with random values, so addresses shift from trial to trial and freed memory holds
garbage rather than zeros.

Modes (interleaved per trial, so a deadline keeps them balanced):
- ``net``: default options with ``scg=False`` (the runner's numeric checks on): a mismatch here is a
  wrong result returned to the caller, the thing that must never happen;
- ``raw``: the same with ``check_numerics=False``: shows whether the graph path itself still goes wrong
  (the safety net hides it in ``net``, falling back with a ``numeric_mismatch`` reason);
- ``copies``: ``raw`` with ``pi=False``: separates input copies from parameter indirection.

Writes ``repro_linears.json`` (rewritten after each trial) under ``--out`` and prints one line per
trial and a summary. Exit status 1 when ``net`` returned a wrong result.

Run from the repository root on a CUDA machine:
``python scripts/gpu/repro_linears.py --trials 50 --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

import grace
from grace import stats
from grace.backend import GraceBackend
from grace.options import GraceOptions

TOL = {"rtol": 2e-3, "atol": 2e-3}
MODES = {
    "net": {"scg": False},
    "raw": {"scg": False, "check_numerics": False},
    "copies": {"scg": False, "check_numerics": False, "pi": False},
}


class LinearsWithCpuScalars(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(8))
        self.scales = [torch.tensor(0.5 + i / 16) for i in range(8)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, scale in zip(self.layers, self.scales, strict=True):
            x = torch.relu(layer(x)) * scale
        return x


class Shuffler:
    """Random-size allocations, some kept across calls, all filled with random values."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.kept: list[torch.Tensor] = []

    def shift(self) -> None:
        for _ in range(self.rng.randint(1, 6)):
            small = self.rng.random() < 0.5  # the small pool holds the 0-d scales and the table
            numel = self.rng.randint(1, 128) if small else self.rng.randint(1 << 10, 1 << 20)
            t = torch.randn(numel, device="cuda") * 1e3
            if self.rng.random() < 0.5:
                self.kept.append(t)
        while len(self.kept) > 24 or (self.kept and self.rng.random() < 0.3):
            self.kept.pop(self.rng.randrange(len(self.kept)))


def _compare(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any] | None:
    try:
        torch.testing.assert_close(got, want, **TOL)
        return None
    except AssertionError:
        diff = (got.double() - want.double()).abs()
        close = torch.isclose(got, want, rtol=TOL["rtol"], atol=TOL["atol"])
        return {
            "max_abs_diff": float(diff.max()),
            "mismatched_fraction": float((~close).float().mean()),
            "got_zero_fraction": float((got == 0).float().mean()),
            "want_zero_fraction": float((want == 0).float().mean()),
            "got_row_std": float(got.std(dim=0).mean()),
            "want_row_std": float(want.std(dim=0).mean()),
        }


def _runner_state() -> list[dict[str, Any]]:
    from grace.runner import _live_runners

    out = []
    for runner in list(_live_runners):
        plan = runner.plan
        for slot in runner.slots.values():
            entry: dict[str, Any] = {
                "signature": slot.signature_text,
                "variant": getattr(slot.record.variant, "value", str(slot.record.variant)),
                "static_indices": list(plan.static_indices),
                "dynamic_indices": list(plan.dynamic_indices),
                "verify_pending": [slot.verify_calls, slot.verify_ptrs is not None],
            }
            graph = slot.graph
            pi_plan = getattr(graph, "pi_plan", None) if graph is not None else None
            if pi_plan is not None:
                table = getattr(pi_plan, "_table", None)
                entry["pi"] = {
                    "uncovered": list(pi_plan.uncovered_indices),
                    "alignment_fallbacks": getattr(pi_plan, "alignment_fallbacks", None),
                    "table_copies": getattr(table, "copies", None),
                    "table_skipped": getattr(table, "skipped", None),
                    "vendor_preludes": len(getattr(pi_plan, "vendor_setups", [])),
                }
                try:
                    entry["pi"]["health"] = pi_plan.health()
                except Exception as exc:
                    entry["pi"]["health"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
    return out


def run_trial(mode: str, trial: int, seed: int, cache_dir: str) -> dict[str, Any]:
    rng = random.Random(seed)
    shuffler = Shuffler(rng)
    torch._dynamo.reset()
    grace.reset()
    stats.forget_all()
    shuffler.shift()
    torch.manual_seed(seed)
    model = LinearsWithCpuScalars().cuda().eval()
    model.scales = [s.clone() for s in model.scales]  # plain attributes stay on the CPU
    options = GraceOptions(cache_dir=cache_dir, scg_samples=5, scg_warmup=1, **MODES[mode])
    compiled = torch.compile(model, backend=GraceBackend(options))
    first, second = 16, 8
    calls: list[tuple[str, torch.Tensor]] = []
    inputs = torch.randn(first, 256, device="cuda")
    calls += [(f"same{i}", inputs) for i in range(4)]
    calls.append(("moved", inputs.clone()))
    fresh = torch.randn(first, 256, device="cuda")
    calls += [(f"fresh{i}", fresh) for i in range(4)]
    other = torch.randn(second, 256, device="cuda")
    calls += [(f"other{i}", other) for i in range(3)]
    calls.append(("back", fresh))
    mismatches: list[dict[str, Any]] = []
    with torch.no_grad():
        for name, x in calls:
            got = compiled(x)
            got_copy = got.clone()  # before anything can replay over it
            shuffler.shift()
            want = model(x)
            problem = _compare(got_copy, want)
            if problem is not None:
                problem["call"] = name
                problem["input_ptr"] = hex(x.data_ptr())
                mismatches.append(problem)
    torch.cuda.synchronize()
    snapshot = stats.snapshot()
    return {
        "mode": mode,
        "trial": trial,
        "seed": seed,
        "mismatches": mismatches,
        "scales_device": str(model.scales[0].device),
        "variants": sorted({str(r["variant"]) for r in snapshot}),
        "skip_reasons": sorted(
            {f"{s['code']}: {s['detail'][:160]}" for r in snapshot for s in r["skip_reasons"]}
        ),
        "pi_stages": [r.get("pi_stages") for r in snapshot if r.get("pi_stages")][:1],
        "runners": _runner_state(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--modes", default="net,raw,copies")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--deadline-s", type=float, default=270.0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {sorted(MODES)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {m: {"trials": 0, "bad_trials": 0, "errors": 0} for m in modes}
    cache_dir = tempfile.mkdtemp(prefix="grace-repro-")
    for trial in range(args.trials):
        if time.monotonic() - start > args.deadline_s:
            print(f"deadline reached after {trial} trials per mode")
            break
        for mode in modes:
            seed = args.seed + trial
            try:
                result = run_trial(mode, trial, seed, cache_dir)
            except Exception as exc:
                result = {"mode": mode, "trial": trial, "seed": seed, "error": traceback.format_exc()}
                summary[mode]["errors"] += 1
                print(f"{mode:6s} trial {trial:3d}: ERROR {type(exc).__name__}: {exc}")
            else:
                bad = bool(result["mismatches"])
                summary[mode]["bad_trials"] += int(bad)
                first = result["mismatches"][0] if bad else None
                print(
                    f"{mode:6s} trial {trial:3d}: {'MISMATCH' if bad else 'ok':8s} "
                    f"variants={result['variants']} "
                    + (f"first={first['call']} max={first['max_abs_diff']:.3g}" if first else "")
                )
            summary[mode]["trials"] += 1
            results.append(result)
        payload = {"summary": summary, "results": results, "torch": torch.__version__}
        (out_dir / "repro_linears.json").write_text(json.dumps(payload, indent=1, default=str))
    print("summary:", json.dumps(summary))
    net = summary.get("net")
    return 1 if net is not None and (net["bad_trials"] or net["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
