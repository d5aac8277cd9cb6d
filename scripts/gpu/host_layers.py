"""Where a captured call's host time goes, layer by layer, on one GPU (the replay-path work).

For each workload (the seed demo: four elementwise ops on 1M floats; a stack of 16 Linear(256)+GELU at
batch 4; the suites' static-KV decode step) it times, interleaved, per call:
- ``raw``: Inductor's kernels replayed from a CUDA graph captured by hand (suites.raw_graph);
- ``raw_copy``: the same after copying the call's inputs into the graph's own;
- ``dynamo_floor``: ``torch.compile`` with a backend that returns a fixed output: Dynamo's frame and guards;
- ``grace_direct``: the callable grace's backend gave Dynamo, called with the arguments Dynamo passed it;
- ``grace_runner``: grace's runner alone, called with the arguments Inductor's compiled graph passed it
  (what lies between it and ``grace_direct`` is AOTAutograd's and Inductor's wrappers);
- ``grace``, ``pt2cg``, ``inductor``, ``eager``: the whole call as a user makes it.
Both ``b2b`` (mean of back-to-back calls between one event pair) and ``lat`` (one call between
synchronisations) are kept as raw samples. The layers then read: Dynamo = ``dynamo_floor``; grace's own
work = ``grace_runner`` - ``raw`` (or ``raw_copy`` where grace copies); the wrappers = ``grace_direct`` -
``grace_runner``; the remainder of ``grace`` is the handover between Dynamo and the wrappers. Writes
``host_layers.json`` under ``--out`` and prints a table (us per call).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import grace
from grace.backend import GraceBackend
from grace.options import GraceOptions
from grace.runner import GraceRunner
from suites.raw_graph import RawGraph
from suites.timing import time_back_to_back, time_interleaved
from suites.workloads import get


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            *[m for _ in range(16) for m in (torch.nn.Linear(256, 256), torch.nn.GELU())]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


WORKLOADS = ("seed_demo", "linear_gelu_16", "llm_decode_static_kv")


def _workloads(names: Sequence[str] = WORKLOADS) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """The models and inputs of ``names`` (of ``WORKLOADS``), built on the GPU."""
    torch.manual_seed(0)
    out: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    for name in names:
        if name == "linear_gelu_16":
            out[name] = (_Stack().cuda().eval(), (torch.randn(4, 256, device="cuda"),))
            continue
        suite_name = "seed_elementwise_1m" if name == "seed_demo" else name
        model, inputs = get(suite_name).factory("standard")(torch.device("cuda"), torch.float32)
        out[name] = (model, tuple(inputs))
    return out


class _Recorder:
    """A backend around grace's that keeps the callable it returns and the arguments of its last call."""

    def __init__(self, inner: GraceBackend) -> None:
        self.inner = inner
        self.runners: list[Callable[..., Any]] = []
        self.last_args: list[tuple[Any, ...]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        runner = self.inner(gm, example_inputs)
        index = len(self.runners)
        self.runners.append(runner)
        self.last_args.append(())

        def call(*args: Any) -> Any:
            self.last_args[index] = args
            return runner(*args)

        return call


class RunnerCalls:
    """While entered, records each call of a grace runner with its arguments (the last one kept)."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[GraceRunner, tuple[Any, ...]]] = {}

    def __enter__(self) -> RunnerCalls:
        original = GraceRunner.run
        calls = self.calls

        def recording(runner: GraceRunner, args: Sequence[Any]) -> Any:
            calls[id(runner)] = (runner, tuple(args))
            return original(runner, args)

        self._original = original
        GraceRunner.run = recording  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        GraceRunner.run = self._original  # type: ignore[method-assign]


def fixed_output_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A Dynamo backend whose callable launches nothing and returns one fixed output: Dynamo's floor."""
    out = gm(*example_inputs)
    return lambda *args: out


def _modes(
    model: Any, inputs: tuple[Any, ...], cache_dir: str
) -> tuple[dict[str, Callable[[], Any]], _Recorder]:
    recorder = _Recorder(GraceBackend(GraceOptions(cache_dir=cache_dir)))
    compiled = {
        "eager": model,
        "inductor": torch.compile(model),
        "pt2cg": torch.compile(model, mode="reduce-overhead"),
        "grace": torch.compile(model, backend=recorder),
        "dynamo_floor": torch.compile(model, backend=fixed_output_backend),
    }
    raw = RawGraph(torch.compile(model), copy_inputs=False)
    raw_copy = RawGraph(torch.compile(model), copy_inputs=True)
    with RunnerCalls() as runner_calls:
        for fn in (*compiled.values(), raw, raw_copy):
            for _ in range(8):
                fn(*inputs)
    torch.cuda.synchronize()
    calls: dict[str, Callable[[], Any]] = {name: (lambda fn=fn: fn(*inputs)) for name, fn in compiled.items()}
    calls["raw"] = raw.timed_call(inputs)
    calls["raw_copy"] = raw_copy.timed_call(inputs)
    if len(recorder.runners) == 1:  # one graph: its runner can be called as Dynamo calls it
        runner, args = recorder.runners[0], recorder.last_args[0]
        calls["grace_direct"] = lambda: runner(*args)
    if len(runner_calls.calls) == 1:  # one runner: called as Inductor's compiled graph calls it
        grace_runner, runner_args = next(iter(runner_calls.calls.values()))
        calls["grace_runner"] = lambda: grace_runner(*runner_args)
    return calls, recorder


def run(samples: int, cache_dir: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (model, inputs) in _workloads().items():
        torch._dynamo.reset()
        grace.reset()
        with torch.no_grad():
            calls, recorder = _modes(model, inputs, cache_dir)
            lat, lat_errors = time_interleaved(calls, samples)
            b2b, b2b_errors = time_back_to_back(calls, samples, 50)
        results[name] = {
            "graphs": len(recorder.runners),
            "lat_samples_ms": lat,
            "b2b_samples_ms": b2b,
            "errors": {**lat_errors, **{f"b2b {k}": v for k, v in b2b_errors.items()}},
            "lat_us": {k: statistics.median(v) * 1e3 for k, v in lat.items() if v},
            "b2b_us": {k: statistics.median(v) * 1e3 for k, v in b2b.items() if v},
            "grace_stats": grace.stats.snapshot(),
        }
    return results


ORDER = (
    *("raw", "raw_copy", "dynamo_floor", "grace_runner", "grace_direct"),
    *("grace", "pt2cg", "inductor", "eager"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache_dir:
        results = run(args.samples, cache_dir)
    env = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "techniques": grace.available_techniques(),
    }
    (args.out / "host_layers.json").write_text(
        json.dumps({"format_version": 1, "env": env, "results": results})
    )
    print("us per call (median)      " + "".join(f"{m:>14}" for m in ORDER))
    for name, r in results.items():
        for kind in ("b2b_us", "lat_us"):
            row = "".join(f"{r[kind][m]:14.1f}" if m in r[kind] else f"{'-':>14}" for m in ORDER)
            print(f"{name[:18]:<18} {kind[:3]:<6}{row}")
        if r["errors"]:
            print(f"  errors: {r['errors']}")
        print(f"  graphs: {r['graphs']}; grace variants: {sorted({s['variant'] for s in r['grace_stats']})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
