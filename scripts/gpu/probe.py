"""Diagnostic probes on one GPU: where grace's peak memory and per-call host time go.

Sections (each written to ``probe.json`` under ``--out`` as it finishes; ``--sections`` picks them):

``memory``: for each workload (standard tier) and each mode (inductor, pt2cg, grace with default
options, and grace with one technique or option changed), the suites' memory window
(suites/harness.py: no cuBLAS workspace, peak reset, base = allocated) over five calls with outputs
dropped; per call the window's peak so far, the call's own peak and the allocated bytes above the
base, and grace's graphs (variant, signature) after the call.

``workspace``: what dropping cuBLAS's workspaces before each timed no-graph sample (grace.decide, Note:
[cuBLAS workspaces] in grace.capture) adds to the no-graph time SCG measures: per workload, Inductor's
compiled callable timed by ``grace.scg.time_variants`` under two labels in one interleaved run, one with
the drop as its untimed setup, one without; raw samples, medians and their ratio.

``host``: on elementwise_64x1m, host microseconds per call of each mode measured over back-to-back calls
with no synchronisation inside (the device queue absorbs them), the device time per call of the same
calls (CUDA events), a bare ``CUDAGraph.replay`` of a one-kernel graph for reference, and a cProfile of
grace's calls (top functions by own time).

Run from the repository root: ``python scripts/gpu/probe.py --out DIR [--sections memory,host]``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import pstats
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pi_gpu_check import build  # this directory is first on the path of a script run from it

import grace
from grace.backend import GraceBackend
from grace.options import GraceOptions
from suites.harness import memory_window_base
from suites.tensors import clone_inputs

MEMORY_WORKLOADS = (
    "XLNetLMHeadModel",
    "MT5ForConditionalGeneration",
    "cpu_position_ids",
    "nvidia_deeprecommender",
    "DistilGPT2",
    "llm_decode_static_kv",
)
GRACE_VARIANTS: dict[str, dict[str, Any]] = {
    "grace": {},
    "grace-scg-off": {"scg": False},
    "grace-pi-off": {"pi": False},
    "grace-no-check": {"check_numerics": False},
    "grace-rebind-off": {"rebind": False},
}
CALLS = 5
MIB = 1 << 20


GRAPH_FIELDS = (
    "graph_id", "graph_hash", "signature", "variant", "calls", "held_output_calls", "graphs_held",
    "output_bytes_held", "rebinds", "recaptures", "kernel_nodes", "copy_bytes_per_replay", "graph_calls",
    "set_blocks",
)  # fmt: skip


def graphs() -> list[dict[str, Any]]:
    """grace's slots: variant, calls, graphs and output bytes held, rebinds and re-captures."""
    return [
        {
            **{k: r.get(k) for k in GRAPH_FIELDS},
            "skips": [(s["code"], s["detail"][:200]) for s in r.get("skip_reasons", [])],
        }
        for r in grace.stats.snapshot()
        if r.get("graph_hash")
    ]


def memory_one(name: str, mode: str, cache_dir: str) -> dict[str, Any]:
    torch._dynamo.reset()
    grace.reset()
    grace.stats.reset()
    model, inputs = build(name)
    base = memory_window_base(torch.device("cuda"))
    if mode == "inductor":
        fn: Callable[..., Any] = torch.compile(model)
    elif mode == "pt2cg":
        fn = torch.compile(model, mode="reduce-overhead")
    else:
        options = GraceOptions(cache_dir=f"{cache_dir}/{name}-{mode}", **GRACE_VARIANTS[mode])
        fn = torch.compile(model, backend=GraceBackend(options))
    per_call = []
    peak_so_far = 0
    with torch.no_grad():
        for _ in range(CALLS):
            torch.cuda.reset_peak_memory_stats()  # the call's own peak; the window's is the running max
            out = fn(*inputs)
            del out
            torch.cuda.synchronize()
            call_peak = torch.cuda.max_memory_allocated() - base
            peak_so_far = max(peak_so_far, call_peak)
            per_call.append(
                {
                    "peak_mib": peak_so_far / MIB,
                    "call_peak_mib": call_peak / MIB,
                    "allocated_mib": (torch.cuda.memory_allocated() - base) / MIB,
                    "reserved_mib": torch.cuda.memory_reserved() / MIB,
                }
            )
    result = {"per_call": per_call, "graphs": graphs() if mode.startswith("grace") else []}
    del fn, model, inputs
    torch._dynamo.reset()
    grace.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return result


def memory(
    cache_dir: str, deadline: float, save: Callable[[str, Any], None], workloads: list[str], modes: list[str]
) -> None:
    for name in workloads:
        for mode in modes:
            if time.monotonic() > deadline:
                save(f"memory/{name}/{mode}", {"error": "deadline"})
                continue
            t0 = time.monotonic()
            try:
                value = memory_one(name, mode, cache_dir)
            except Exception as exc:
                value = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            value["seconds"] = round(time.monotonic() - t0, 1)
            last = value.get("per_call", [{}])[-1]
            print(
                f"memory {name} {mode}: peak {last.get('peak_mib', '-')} MiB",
                value.get("error", ""),
                flush=True,
            )
            save(f"memory/{name}/{mode}", value)


WORKSPACE_WORKLOADS = ("alexnet", "lcnet_050", "mlp", "XLNetLMHeadModel", "linear8_cpu_scalar")


def workspace(deadline: float, save: Callable[[str, Any], None], workloads: list[str]) -> None:
    from grace.compat.torch import clear_cublas_workspaces
    from grace.scg import Variant, medians, time_variants

    # Two labels for one callable: NO_GRAPH gets the drop before each run, GRAPH_COPIES does not.
    fresh, kept = Variant.NO_GRAPH, Variant.GRAPH_COPIES
    for name in workloads:
        if time.monotonic() > deadline:
            save(f"workspace/{name}", {"error": "deadline"})
            continue
        torch._dynamo.reset()
        model, inputs = build(name)
        fn = torch.compile(model)
        with torch.no_grad():
            for _ in range(3):
                fn(*inputs)
            samples = time_variants(
                {fresh: functools.partial(fn, *inputs), kept: functools.partial(fn, *inputs)},
                samples=60,
                warmup=2,
                device=torch.device("cuda"),
                untimed_setup={fresh: clear_cublas_workspaces},
            )
        med = medians(samples)
        value = {
            "samples_ms": {"workspace_dropped": samples[fresh], "workspace_kept": samples[kept]},
            "median_ms": {"workspace_dropped": med[fresh], "workspace_kept": med[kept]},
            "dropped_over_kept": med[fresh] / med[kept],
        }
        print(f"workspace {name}: dropped/kept {value['dropped_over_kept']:.4f}", flush=True)
        save(f"workspace/{name}", value)
        del fn, model, inputs
        gc.collect()


def host(cache_dir: str, save: Callable[[str, Any], None]) -> None:
    torch._dynamo.reset()
    grace.reset()
    model, inputs = build("elementwise_64x1m")
    sets = [inputs, clone_inputs(inputs)]
    modes = {
        "inductor": torch.compile(model),
        "pt2cg": torch.compile(model, mode="reduce-overhead"),
        "grace_pi": torch.compile(model, backend=GraceBackend(GraceOptions(cache_dir=cache_dir, scg=False))),
        "grace": torch.compile(model, backend=GraceBackend(GraceOptions(cache_dir=cache_dir + "-scg"))),
    }
    result: dict[str, Any] = {}
    n = 200
    with torch.no_grad():
        for fn in modes.values():
            for i in range(8):
                fn(*sets[i % 2])
        torch.cuda.synchronize()
        for mode, fn in modes.items():
            host_us, device_us = [], []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                t0 = time.perf_counter()
                for i in range(n):
                    fn(*sets[i % 2])
                t1 = time.perf_counter()
                end.record()
                torch.cuda.synchronize()
                host_us.append((t1 - t0) / n * 1e6)
                device_us.append(start.elapsed_time(end) / n * 1e3)
            result[mode] = {"host_us_per_call": host_us, "device_us_per_call": device_us}
            print(
                f"host {mode}: host {min(host_us):.1f} us/call, device {min(device_us):.1f} us/call",
                flush=True,
            )
        # the runner alone, without Dynamo's frame and guards
        from grace import runner as grace_runner

        live = [r for r in list(grace_runner._live_runners) if r.slots]
        if live:
            runner = live[0]
            t0 = time.perf_counter()
            for i in range(n):
                runner(*sets[i % 2])
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            result["runner_alone_us_per_call"] = (t1 - t0) / n * 1e6
        # a bare one-kernel graph replay
        x = torch.zeros(1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            x.add_(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            g.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        result["bare_replay_us_per_call"] = (t1 - t0) / n * 1e6
        prof = cProfile.Profile()
        fn = modes["grace_pi"]
        prof.enable()
        for i in range(n):
            fn(*sets[i % 2])
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(35)
        result["cprofile_grace_pi"] = text.getvalue()[-12000:]
        result["grace_graphs"] = graphs()
    save("host", result)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="host,memory")
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--workloads", default=",".join(MEMORY_WORKLOADS))
    parser.add_argument("--modes", default="inductor,pt2cg," + ",".join(GRACE_VARIANTS))
    parser.add_argument("--workspace-workloads", default=",".join(WORKSPACE_WORKLOADS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    results: dict[str, Any] = {"env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}}
    path = args.out / "probe.json"

    def save(key: str, value: Any) -> None:
        results[key] = value
        path.write_text(json.dumps(results, indent=1, default=str))

    cache_dir = tempfile.mkdtemp(prefix="grace-probe-")
    for section in args.sections.split(","):
        try:
            if section == "host":
                host(cache_dir, save)
            elif section == "memory":
                memory(cache_dir, deadline, save, args.workloads.split(","), args.modes.split(","))
            elif section == "workspace":
                workspace(deadline, save, args.workspace_workloads.split(","))
        except Exception as exc:
            save(f"{section}-error", traceback.format_exc()[-3000:])
            print(f"{section}: ERROR {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
