"""GPU check of parameter indirection: numerics at moved inputs, bytes per replay, timing against pt2cg.

Sections run in priority order within a deadline and the results are rewritten to ``pi_gpu.json`` after
each one, so a lease that ends early still returns everything measured so far:

1. ``numerics``: each workload through grace with ``scg=False`` (PI kept whenever it passed the runner's
   own check); then calls on inputs at new addresses with new values, compared with eager; which
   variant ran, PI's stages, bytes per replay (PI table) against bytes per replay (input copies).
2. ``timing``: eager, inductor, pt2cg (``mode="reduce-overhead"``), grace with PI forced and grace with
   SCG, interleaved and rotated; each sample is the mean of ``--iters`` (100) back-to-back calls between
   CUDA events, a window long enough that the host time from the first call to its first kernel, paid
   once per window from an idle device, is no part of the figure (with 10 calls it added 5-10 us per call
   on elementwise_64x1m, where the device needs about 130 us per call); inputs alternate between two sets
   at different addresses (so PI writes its table and pt2cg copies every call). Floors: the device-busy
   time of one isolated inductor call (profiler), and the busy time per call of 20 back-to-back inductor
   calls (``suites.launches.profile_steady``), the floor a back-to-back figure is judged by. Per mode
   also: the steady-state busy, copy and idle time per call, and pt2cg over the steady floor (the most
   any variant could gain on pt2cg). ``grace_pi`` runs with grace's default options. For the workloads of
   ``TABLE_UPDATE_WORKLOADS`` grace with PI forced also runs once per way of writing PI's pointer table,
   in the same rotation (``pi_table_update``: ``copy``, a host-to-device copy before each replay, as
   ``grace_pi_copy``; ``node``, the graph's fill node, as ``grace_pi_node``), and ``table_update``
   reports node/copy for the medians and the steady figures, and which path served.

Run from the repository root on a CUDA machine: ``python scripts/gpu/pi_gpu_check.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import grace
from grace.backend import GraceBackend
from grace.options import GraceOptions
from suites.launches import profile_steady
from suites.timing import mean_back_to_back_ms

NUMERIC_WORKLOADS = (
    "elementwise_64x1m",
    "seed_elementwise_1m",
    "pyhpc_equation_of_state",
    "pyhpc_turbulent_kinetic_energy",
    "nvidia_deeprecommender",
    "mlp",
    "bf16_matmul",
)
TABLE_UPDATE_WORKLOADS = ("elementwise_64x1m",)  # timed under both pi_table_update paths
TIMING_WORKLOADS = (
    "elementwise_64x1m",
    "nvidia_deeprecommender",
    "pyhpc_equation_of_state",
    "pyhpc_turbulent_kinetic_energy",
)


class _Matmul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    if name == "bf16_matmul":
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(2048, 2048, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(2048, 2048, device="cuda", generator=g).to(torch.bfloat16)
        return _Matmul(), (a, b)
    from suites.workloads import get

    model, inputs = get(name).factory("standard")(torch.device("cuda"), torch.float32)
    if hasattr(model, "eval"):
        model = model.eval()
    return model, tuple(inputs)


def moved(inputs: tuple[Any, ...], scale: float) -> tuple[Any, ...]:
    """The same inputs at new addresses with new values (floats scaled, others copied)."""
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            out.append((t * scale).clone())
        elif isinstance(t, torch.Tensor):
            out.append(t.clone())
        else:
            out.append(t)
    return tuple(out)


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    return []


def compare(got: Any, expected: Any, tol: float) -> dict[str, Any]:
    a, b = _flat(got), _flat(expected)
    if len(a) != len(b):
        return {"ok": False, "why": f"{len(a)} outputs vs {len(b)}"}
    worst = 0.0
    ok = True
    for x, y in zip(a, b, strict=True):
        x64, y64 = x.detach().double(), y.detach().double()
        diff = (x64 - y64).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok = ok and bool(torch.allclose(x64, y64, rtol=tol, atol=tol))
    return {"ok": ok, "max_abs": worst, "tol": tol}


def grace_backend(cache_dir: str, **options: Any) -> GraceBackend:
    return GraceBackend(GraceOptions(cache_dir=cache_dir, **options))


def numerics(name: str, cache_dir: str) -> dict[str, Any]:
    torch._dynamo.reset()
    grace.reset()
    model, inputs = build(name)
    tol = 2e-2 if name == "bf16_matmul" else 1e-3
    compiled = torch.compile(model, backend=grace_backend(cache_dir, scg=False))
    checks = []
    with torch.no_grad():
        for call, scale in enumerate((1.0, 1.0, 0.5, 1.5, 0.75)):
            args = inputs if call < 2 else moved(inputs, scale)
            expected = model(*args)
            got = compiled(*args)
            torch.cuda.synchronize()
            checks.append({"call": call, "moved": call >= 2, **compare(got, expected, tol)})
    records = [r for r in grace.stats.snapshot() if r.get("graph_hash")]
    copy_bytes = sum(int(t.nbytes) for t in inputs if isinstance(t, torch.Tensor))
    return {
        "checks": checks,
        "numerics_ok": all(c["ok"] for c in checks),
        "variants": [r["variant"] for r in records],
        "pi_used": any(r["variant"] == "graph_pi" for r in records),
        "pi_bytes_per_replay": [r["pi_bytes_per_replay"] for r in records],
        "input_bytes": copy_bytes,
        "pi_stages": [r["pi_stages"] for r in records],
        "skip_reasons": [r["skip_reasons"] for r in records],
        "decision": [r["decision"] for r in records],
    }


def floor_ms(call: Callable[[], Any]) -> float | None:
    """Summed CUDA kernel time of one call, from the profiler (the GPU-busy floor)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        reps = 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()
        total_us = 0.0
        for event in prof.events():
            kind = str(getattr(event, "device_type", ""))
            if "CUDA" in kind:
                total_us += float(getattr(event, "device_time", getattr(event, "cuda_time", 0.0)) or 0.0)
        return total_us / reps / 1000.0 if total_us else None
    except Exception:
        return None


def timing(name: str, cache_dir: str, samples: int, iters: int) -> dict[str, Any]:
    torch._dynamo.reset()
    grace.reset()
    model, inputs = build(name)
    sets = [inputs, moved(inputs, 1.0)]
    modes: dict[str, Any] = {
        "eager": model,
        "inductor": torch.compile(model),
        "pt2cg": torch.compile(model, mode="reduce-overhead"),
        "grace_pi": torch.compile(model, backend=grace_backend(cache_dir, scg=False)),
        "grace": torch.compile(model, backend=grace_backend(cache_dir + "-scg")),
    }
    if name in TABLE_UPDATE_WORKLOADS:
        for path in ("copy", "node"):
            modes[f"grace_pi_{path}"] = torch.compile(
                model, backend=grace_backend(f"{cache_dir}-{path}", scg=False, pi_table_update=path)
            )
    counter = {"i": 0}

    def caller(fn: Any) -> Callable[[], Any]:
        def call() -> Any:
            counter["i"] += 1
            return fn(*sets[counter["i"] % 2])

        return call

    calls = {m: caller(fn) for m, fn in modes.items()}
    raw: dict[str, list[float]] = {m: [] for m in calls}
    with torch.no_grad():
        for call in calls.values():
            for _ in range(6):
                call()
        torch.cuda.synchronize()
        order = list(calls)
        for s in range(samples):
            shift = s % len(order)
            for mode in order[shift:] + order[:shift]:
                raw[mode].append(mean_back_to_back_ms(calls[mode], iters))
        floor = floor_ms(calls["inductor"])
        steady = {m: profile_steady(call, 20).to_dict() for m, call in calls.items()}
    med = {m: statistics.median(v) for m, v in raw.items()}
    steady_floor = steady["inductor"]["busy_ms"]
    records = [r for r in grace.stats.snapshot() if r.get("graph_hash")]
    out: dict[str, Any] = {
        "median_ms": med,
        "samples_ms": raw,
        "floor_ms": floor,
        "pt2cg_over_grace_pi": med["pt2cg"] / med["grace_pi"],
        "pt2cg_over_steady_floor": med["pt2cg"] / steady_floor if steady_floor else None,
        "pt2cg_over_grace": med["pt2cg"] / med["grace"],
        "grace_pi_over_floor": (med["grace_pi"] / floor) if floor else None,
        "steady_floor_ms": steady_floor,
        "grace_pi_over_steady_floor": (med["grace_pi"] / steady_floor) if steady_floor else None,
        "steady": steady,
        "variants": [(r["signature"], r["variant"], r["pi_bytes_per_replay"]) for r in records],
    }
    if "grace_pi_node" in med:
        out["table_update"] = table_update_summary(med, steady, records)
    return out


def table_update_summary(
    med: dict[str, float], steady: dict[str, dict[str, Any]], records: list[dict[str, Any]]
) -> dict[str, Any]:
    """grace with PI under the two table-update paths: node/copy ratios and which path each graph used."""

    def ratio(node: float | None, copy: float | None) -> float | None:
        return node / copy if node is not None and copy else None

    copy_steady, node_steady = steady["grace_pi_copy"], steady["grace_pi_node"]
    return {
        "median_ms": {"copy": med["grace_pi_copy"], "node": med["grace_pi_node"]},
        "node_over_copy": ratio(med["grace_pi_node"], med["grace_pi_copy"]),
        "steady": {"copy": copy_steady, "node": node_steady},
        "steady_node_over_copy": {
            key: ratio(node_steady.get(key), copy_steady.get(key))
            for key in ("busy_ms", "span_ms", "idle_ms")
        },
        "table_stages": [
            [msg for stage, _, msg in r.get("pi_stages") or [] if stage == "table"] for r in records
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=200.0)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "format": 1,
        "env": {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
            "techniques": grace.available_techniques(),
        },
        "numerics": {},
        "timing": {},
        "not_run": [],
    }
    path = args.out / "pi_gpu.json"

    def save() -> None:
        path.write_text(json.dumps(results, indent=1, default=str))

    cache_dir = tempfile.mkdtemp(prefix="grace-pi-gpu-")
    plan = [("numerics", "elementwise_64x1m"), ("numerics", "bf16_matmul"), ("timing", "elementwise_64x1m")]
    plan += [("numerics", n) for n in NUMERIC_WORKLOADS if ("numerics", n) not in plan]
    plan += [("timing", n) for n in TIMING_WORKLOADS if ("timing", n) not in plan]
    for section, name in plan:
        elapsed = time.monotonic() - started
        if elapsed > args.deadline_s:
            results["not_run"].append(f"{section}/{name}: deadline")
            continue
        t0 = time.monotonic()
        try:
            if section == "numerics":
                value = numerics(name, cache_dir)
                print(
                    f"numerics {name}: ok={value['numerics_ok']} pi_used={value['pi_used']} "
                    f"variants={value['variants']} pi_bytes={value['pi_bytes_per_replay']} "
                    f"input_bytes={value['input_bytes']}",
                    flush=True,
                )
            else:
                value = timing(name, cache_dir, args.samples, args.iters)
                print(
                    f"timing {name}: "
                    + ", ".join(f"{m} {v:.4f}" for m, v in value["median_ms"].items())
                    + f" ms; floor {value['floor_ms']} (steady {value['steady_floor_ms']:.4f});"
                    + f" pt2cg/grace_pi {value['pt2cg_over_grace_pi']:.2f}x"
                    + (
                        f"; table node/copy {value['table_update']['node_over_copy']:.3f}"
                        if "table_update" in value
                        else ""
                    ),
                    flush=True,
                )
        except Exception as exc:
            value = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
            print(f"{section} {name}: ERROR {value['error']}", flush=True)
        value["seconds"] = round(time.monotonic() - t0, 1)
        results[section][name] = value
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
