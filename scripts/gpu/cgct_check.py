"""CGCT on a GPU: share of kernels inside CUDA graphs, graph launches per Dynamo graph, latency.

Workloads (each a small model whose CPU work keeps PyTorch2-CG from capturing it whole):
  cpu_scalars   8 x Linear(256), each output multiplied by ``torch.tensor(0.5)`` (a CPU scalar)
  position_ids  embedding + ``torch.arange(n).to(device)`` position ids + 4 Linear/GELU blocks
  anchors       conv head with an anchors buffer and a list of grids kept on the CPU
  cpu_input     a CPU mask input copied with ``.to(device)`` inside the model

Modes:
  pt2cg                 torch.compile(mode="reduce-overhead"), Inductor's defaults
  pt2cg-nopartition     the same with torch._inductor.config.graph_partition=False (pre-2.9 behaviour)
  grace-cgct            grace.compile when the tree has it, else grace.cgct.transform in a small
                        backend that then calls Inductor with CUDA graphs on (reduce-overhead)
  grace-cgct-nopartition  the same with graph_partition=False

Per workload and mode: eager check (max abs error vs eager), median latency (CUDA events, 50 calls
after warm-up), and from torch.profiler over 5 calls: kernels launched by cudaGraphLaunch vs
individually, graph launches per call, Dynamo graphs, cudagraph skips. Prints a table and writes
``$OUT/cgct_check.json`` (rewritten after every measurement, so a time-out keeps what was done).

Run: python scripts/gpu/cgct_check.py [--workloads a,b] [--modes m1,m2] [--iters 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grace.cgct as cgct

DEVICE = torch.device("cuda", 0)


# ---------------------------------------------------------------------------------------------------
# workloads


class CpuScalars(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) * torch.tensor(0.5)
        return x


class PositionIds(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(1000, 256)
        self.positions = torch.nn.Embedding(512, 256)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        position_ids = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1).to(ids.device)
        h = self.tokens(ids) + self.positions(position_ids)
        for block in self.blocks:
            h = h + torch.nn.functional.gelu(block(h))
        return h


class Anchors(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.head = torch.nn.Conv2d(16, 4, 1)
        self.register_buffer("anchors", torch.rand(4, 32, 32))
        self.grids = [torch.linspace(0, 1, 32), torch.linspace(-1, 1, 32)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deltas = self.head(torch.relu(self.conv(x)))
        boxes = deltas + self.anchors.to(x.device)
        for grid in self.grids:
            boxes = boxes * grid.to(x.device)
        return boxes.sigmoid()


class CpuInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x * mask.to(x.device)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def make_workload(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Model (GPU weights, CPU attributes where the workload says) and inputs, same seed each time."""
    torch.manual_seed(0)
    if name == "cpu_scalars":
        return CpuScalars().to(DEVICE).eval(), (torch.randn(64, 256, device=DEVICE),)
    if name == "position_ids":
        return PositionIds().to(DEVICE).eval(), (torch.randint(0, 1000, (8, 128), device=DEVICE),)
    if name == "anchors":
        model = Anchors().to(DEVICE).eval()
        model.anchors = model.anchors.cpu()  # the detection-style buffer stays on the CPU
        model.grids = [g.cpu() for g in model.grids]
        return model, (torch.randn(2, 16, 32, 32, device=DEVICE),)
    if name == "cpu_input":
        return CpuInput().to(DEVICE).eval(), (torch.randn(64, 256, device=DEVICE), torch.rand(256))
    raise ValueError(name)


WORKLOADS = ["cpu_scalars", "position_ids", "anchors", "cpu_input"]
MODES = ["pt2cg", "pt2cg-nopartition", "grace-cgct", "grace-cgct-nopartition"]


# ---------------------------------------------------------------------------------------------------
# compilation


def cgct_inductor_backend(diagnoses: list[str]) -> Callable[..., Any]:
    """grace.cgct.transform, then Inductor with its CUDA graphs (what reduce-overhead does)."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        result = cgct.transform(gm, example_inputs)
        diagnoses.extend(d.describe() for d in result.diagnoses)
        compiled = compile_fx(result.gm, result.example_inputs, config_patches={"triton.cudagraphs": True})
        adapter = result.input_adapter
        if adapter is None:
            return compiled
        boxed = getattr(compiled, "_boxed_call", False)

        def run(*args: Any) -> Any:
            adapted = adapter(list(args))
            return compiled(adapted) if boxed else compiled(*adapted)

        return run

    return backend


def compile_mode(model: torch.nn.Module, mode: str, diagnoses: list[str]) -> tuple[Any, str]:
    if mode.startswith("pt2cg"):
        return torch.compile(model, mode="reduce-overhead"), "torch.compile(mode='reduce-overhead')"
    import grace

    if hasattr(grace, "compile"):
        return grace.compile(model), "grace.compile (runtime branch backend)"
    return torch.compile(
        model, backend=cgct_inductor_backend(diagnoses)
    ), "cgct.transform + Inductor cudagraphs"


# ---------------------------------------------------------------------------------------------------
# measurement


def kernel_census(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """Kernels launched through cudaGraphLaunch vs individually, from a profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    launcher: dict[Any, str] = {}
    for event in events:
        if event.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {}):
            launcher[event["args"]["correlation"]] = event.get("name", "")
    in_graph = individual = unknown = memcpy = 0
    graph_launches = sum(
        1
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "GraphLaunch" in e.get("name", "")
    )
    for event in events:
        category = event.get("cat")
        if category in ("gpu_memcpy", "gpu_memset"):
            memcpy += 1
        if category != "kernel":
            continue
        name = launcher.get(event.get("args", {}).get("correlation"))
        if name is None:
            unknown += 1
        elif "GraphLaunch" in name:
            in_graph += 1
        else:
            individual += 1
    total = in_graph + individual + unknown
    return {
        "kernels_per_call": total / calls,
        "kernels_in_graphs_per_call": in_graph / calls,
        "kernels_individual_per_call": individual / calls,
        "kernels_unattributed_per_call": unknown / calls,
        "memcpy_memset_per_call": memcpy / calls,
        "graph_launches_per_call": graph_launches / calls,
        "share_in_graphs": (in_graph / total) if total else 0.0,
    }


def latency_ms(fn: Callable[[], Any], iters: int) -> list[float]:
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def run_one(workload: str, mode: str, iters: int) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    model, inputs = make_workload(workload)
    with torch.no_grad():
        expected = model(*inputs).float()
    diagnoses: list[str] = []
    partition = not mode.endswith("nopartition")
    record: dict[str, Any] = {"workload": workload, "mode": mode, "graph_partition": partition}
    with inductor_config.patch(graph_partition=partition), torch.no_grad():
        compiled, implementation = compile_mode(model, mode, diagnoses)
        record["implementation"] = implementation
        started = time.perf_counter()
        for _ in range(5):  # cudagraph trees warm up, then record
            out = compiled(*inputs)
        torch.cuda.synchronize()
        record["compile_and_warmup_s"] = time.perf_counter() - started
        record["max_abs_error_vs_eager"] = float((out.float() - expected).abs().max())
        record["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
        record["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
        record.update(kernel_census(lambda: compiled(*inputs), calls=5))
        samples = latency_ms(lambda: compiled(*inputs), iters)
    record["median_ms"] = statistics.median(samples)
    record["samples_ms"] = samples
    graphs = max(record["dynamo_graphs"], 1)
    record["graph_launches_per_dynamo_graph"] = record["graph_launches_per_call"] / graphs
    record["cgct_diagnoses"] = diagnoses
    if workload == "anchors":
        record["anchors_device_after"] = str(model.anchors.device)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "format": 1,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "graph_partition_default": bool(getattr(inductor_config, "graph_partition", False)),
        "results": [],
    }
    path = out_dir / "cgct_check.json"
    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            try:
                record = run_one(workload, mode, args.iters)
            except Exception as error:
                record = {"workload": workload, "mode": mode, "error": f"{type(error).__name__}: {error}"}
                traceback.print_exc()
            report["results"].append(record)
            path.write_text(json.dumps(report, indent=2))
            print(f"done {workload} {mode}", flush=True)

    by_key = {(r["workload"], r["mode"]): r for r in report["results"]}
    columns = ("in graphs", "kern/call", "launch/dg", "ms", "err")
    print(f"{'workload':<13} {'mode':<23} " + " ".join(f"{c:>9}" for c in columns))
    for r in report["results"]:
        if "error" in r:
            print(f"{r['workload']:<13} {r['mode']:<23} ERROR {r['error'][:80]}")
            continue
        print(
            f"{r['workload']:<13} {r['mode']:<23} {r['share_in_graphs']:>9.1%} {r['kernels_per_call']:>9.1f} "
            f"{r['graph_launches_per_dynamo_graph']:>9.2f} {r['median_ms']:>9.3f} "
            f"{r['max_abs_error_vs_eager']:>9.1e}"
        )
    for workload in args.workloads.split(","):
        for base in ("pt2cg", "pt2cg-nopartition"):
            grace_mode = base.replace("pt2cg", "grace-cgct")
            a, b = by_key.get((workload, base)), by_key.get((workload, grace_mode))
            if a and b and "median_ms" in a and "median_ms" in b:
                speedup = a["median_ms"] / b["median_ms"]
                report.setdefault("speedups", {})[f"{workload}:{grace_mode}/{base}"] = speedup
                print(f"speedup {workload} {grace_mode} over {base}: {speedup:.2f}x")
    path.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
