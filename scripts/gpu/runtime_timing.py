"""Focused timing check of the grace runtime on one GPU: grace (SCG) vs inductor vs pt2cg.

Workloads: a 64 x 1M float32 input through 3 elementwise ops (SCG should keep no graph when PI is
unavailable: the input copy costs more than the launch it saves) and a small MLP (a graph wins).
Modes are interleaved and rotated; each sample is the mean of ``--iters`` back-to-back calls between
CUDA events, starting from an idle GPU; raw samples are kept. Writes ``timing.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import grace
from grace.backend import GraceBackend
from grace.options import GraceOptions
from suites.timing import mean_back_to_back_ms


def _elementwise(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x * 1.5 + 0.25)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            *[m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.GELU())]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _workloads() -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {
        "elementwise_64x1M": (_elementwise, (torch.randn(64, 1 << 20, device="cuda"),)),
        "mlp_small": (_MLP().cuda().eval(), (torch.randn(16, 256, device="cuda"),)),
    }


def run(samples: int, iters: int, cache_dir: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (fn, inputs) in _workloads().items():
        grace.stats.reset()
        torch._dynamo.reset()
        modes = {
            "inductor": torch.compile(fn),
            "pt2cg": torch.compile(fn, mode="reduce-overhead"),
            "grace": torch.compile(fn, backend=GraceBackend(GraceOptions(cache_dir=cache_dir))),
        }
        calls = {m: (lambda c=c, inputs=inputs: c(*inputs)) for m, c in modes.items()}
        with torch.no_grad():
            reference = fn(*inputs)
            for mode, call in calls.items():
                for _ in range(5):
                    out = call()
                torch.testing.assert_close(out, reference, rtol=2e-3, atol=2e-3, msg=f"{name}/{mode}")
            raw: dict[str, list[float]] = {m: [] for m in calls}
            order = list(calls)
            for s in range(samples):
                shift = s % len(order)
                for mode in order[shift:] + order[:shift]:
                    raw[mode].append(mean_back_to_back_ms(calls[mode], iters))
        med = {m: statistics.median(v) for m, v in raw.items()}
        grace_records = [r for r in grace.stats.snapshot() if r["graph_hash"]]
        results[name] = {
            "samples_ms": raw,
            "median_ms": med,
            "grace_vs_inductor": med["inductor"] / med["grace"],
            "grace_vs_pt2cg": med["pt2cg"] / med["grace"],
            "grace_vs_best": min(med["inductor"], med["pt2cg"]) / med["grace"],
            "grace_stats": grace_records,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as cache_dir:
        results = run(args.samples, args.iters, cache_dir)
    env = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "techniques": grace.available_techniques(),
    }
    (args.out / "timing.json").write_text(
        json.dumps({"format_version": 1, "env": env, "results": results}, indent=1)
    )
    ok = True
    for name, r in results.items():
        med = r["median_ms"]
        variants = sorted({s["variant"] for s in r["grace_stats"]})
        print(
            f"{name}: inductor {med['inductor']:.4f} ms, pt2cg {med['pt2cg']:.4f} ms, "
            f"grace {med['grace']:.4f} ms; grace/pt2cg speedup {r['grace_vs_pt2cg']:.2f}x, "
            f"vs best {r['grace_vs_best']:.3f}; "
            f"variants {variants}"
        )
        if r["grace_vs_best"] < 1 / 1.03:
            ok = False
            print(f"  CHECK FAILED: grace slower than min(inductor, pt2cg) beyond 3% on {name}")
    elementwise = results["elementwise_64x1M"]
    if env["techniques"]["pi"] is not None and {s["variant"] for s in elementwise["grace_stats"]} != {
        "no_graph"
    }:
        ok = False
        print("  CHECK FAILED: SCG did not keep no graph on the 64x1M input without PI")
    print("timing checks:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
