"""Why a synchronised call costs several times its back-to-back time: a device-side timeline per call.

``host_layers.py`` says how much host time each layer costs; this says where a synchronised call's
latency goes. For the seed demo (and the other workloads of ``host_layers``, with ``--all``) it runs
each mode (``raw``, ``raw_copy``, ``dynamo_floor``, ``grace``, ``pt2cg``, ``inductor``) for a number of
calls, each between synchronisations and inside its own ``record_function`` range, under
``torch.profiler`` with CPU and CUDA activities. From the events, per call:
- ``host_us``: the range's length (the call's host time, up to its return);
- ``first_gpu_us``: from the range's start to the start of the first GPU activity (kernel or copy) of
  the call: host work before the first launch plus the launch latency;
- ``gpu_busy_us``: the summed length of the call's GPU activities; ``gpu_span_us``: first start to last
  end (so ``gpu_span_us - gpu_busy_us`` is the idle time between them);
- ``tail_us``: from the end of the call's last GPU activity to the end of the range (negative when the
  GPU finishes after the call returned, as it should for an asynchronous call).
It also writes a cProfile of 2,000 back-to-back grace calls (the 30 functions of most own time) so the
host side can be read function by function. Writes ``call_timeline.json`` (every call's figures, raw),
``grace_cprofile.txt`` and one Chrome trace per workload under ``--out``, and prints medians.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from host_layers import _modes, _workloads
from torch.autograd import DeviceType

import grace

MODES = ("raw", "raw_copy", "dynamo_floor", "grace", "pt2cg", "inductor")
FIGURES = ("host_us", "first_gpu_us", "gpu_busy_us", "gpu_span_us", "tail_us")


def _profile(calls: dict[str, Callable[[], Any]], count: int, trace: Path) -> list[Any]:
    """The profiler's events of ``count`` synchronised calls of every mode, interleaved."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(count):
            for name in MODES:
                if name not in calls:
                    continue
                torch.cuda.synchronize()
                with torch.profiler.record_function(f"call:{name}:{i}"):
                    calls[name]()
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    return list(prof.events())


def _per_call(events: list[Any]) -> dict[str, list[dict[str, float]]]:
    """Every call range's figures (see the module docstring), per mode."""
    ranges = [e for e in events if e.name.startswith("call:") and e.device_type == DeviceType.CPU]
    gpu = sorted((e for e in events if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    ranges.sort(key=lambda e: e.time_range.start)
    found: dict[str, list[dict[str, float]]] = {}
    for index, r in enumerate(ranges):
        start, end = r.time_range.start, r.time_range.end
        limit = ranges[index + 1].time_range.start if index + 1 < len(ranges) else float("inf")
        mine = [g for g in gpu if start <= g.time_range.start < limit]
        mode = r.name.split(":")[1]
        figures = {"host_us": float(end - start)}
        if mine:
            first = min(g.time_range.start for g in mine)
            last = max(g.time_range.end for g in mine)
            figures.update(
                first_gpu_us=float(first - start),
                gpu_busy_us=float(sum(g.time_range.end - g.time_range.start for g in mine)),
                gpu_span_us=float(last - first),
                tail_us=float(end - last),
                gpu_activities=float(len(mine)),
            )
        found.setdefault(mode, []).append(figures)
    return found


def _cprofile(call: Callable[[], Any], calls: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()


def run(out: Path, count: int, names: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (model, inputs) in _workloads().items():
        if name not in names:
            continue
        torch._dynamo.reset()
        grace.reset()
        with tempfile.TemporaryDirectory() as cache_dir, torch.no_grad():
            calls, _ = _modes(model, inputs, cache_dir)
            _profile(calls, 3, out / f"warm-{name}.json")  # the profiler's own first-use costs
            per_call = _per_call(_profile(calls, count, out / f"trace-{name}.json"))
            (out / f"grace_cprofile-{name}.txt").write_text(_cprofile(calls["grace"], 2000))
        results[name] = {
            "calls": per_call,
            "median": {
                mode: {
                    f: statistics.median(c[f] for c in rows if f in c)
                    for f in FIGURES
                    if any(f in c for c in rows)
                }
                for mode, rows in per_call.items()
            },
        }
        (out / f"warm-{name}.json").unlink(missing_ok=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument(
        "--all", action="store_true", help="every workload of host_layers, not only the seed demo"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = list(_workloads()) if args.all else ["seed_demo"]
    results = run(args.out, args.calls, names)
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    (args.out / "call_timeline.json").write_text(
        json.dumps({"format_version": 1, "env": env, "results": results})
    )
    print("us per call (median)      " + "".join(f"{f:>14}" for f in FIGURES))
    for name, r in results.items():
        for mode, figures in r["median"].items():
            row = "".join(f"{figures[f]:14.1f}" if f in figures else f"{'-':>14}" for f in FIGURES)
            print(f"{name[:14]:<14} {mode:<12}{row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
