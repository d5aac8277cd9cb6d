"""Peak CUDA memory of grace's first calls against PyTorch's cudagraph trees ("reduce-overhead"), on
64 float32 inputs of 1M elements (U = 256 MiB), on a chain of matmuls (cuBLAS workspaces) and on a
callable that updates a large input in place, measured as suites/harness.py measures it: peak allocated during
compile and warm-up (three calls, outputs dropped) above what was allocated before, the inputs included,
starting without cuBLAS workspaces. The expected figures are derived in Note: [Deciding-call memory]
(grace.decide). Numerics equal eager afterwards, also with the inputs at new addresses. All tests carry
``gpu``."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grace import stats
from grace.backend import GraceBackend
from grace.options import GraceOptions
from suites.harness import memory_window_base

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

INPUTS = 64
NUMEL = 1 << 20
MIB = 1 << 20
U = INPUTS * NUMEL * 4  # bytes of the dynamic inputs
CALLS = 3  # compile + first run, deciding call / recording, first steady call / first replay


def combine(*xs: torch.Tensor) -> torch.Tensor:
    """One 4 MiB output from all 64 inputs (O = U / 64): one fused Triton kernel reads every input."""
    acc = xs[0] * 0.5
    for i, x in enumerate(xs[1:], start=1):
        acc = acc + x * (1.0 + i / 64)
    return torch.relu(acc)


def each(*xs: torch.Tensor) -> list[torch.Tensor]:
    """One 4 MiB output per input (O = U)."""
    return [torch.relu(x * 2.0 + 1.0) for x in xs]


def _inputs() -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(NUMEL, device="cuda", generator=gen) for _ in range(INPUTS)]


def _peak(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> int:
    """Peak allocated above the base during the first ``CALLS`` calls (suites/harness.py's window)."""
    base = memory_window_base(torch.device("cuda"))  # each side pays for its own cuBLAS workspace
    with torch.no_grad():
        for _ in range(CALLS):
            fn(*inputs)  # the output is dropped before the next call, as the harness does
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def _pt2cg_peak(f: Callable[..., Any], inputs: list[torch.Tensor]) -> int:
    from torch._dynamo.utils import counters

    skips_before = int(counters["inductor"].get("cudagraph_skips", 0))
    peak = _peak(torch.compile(f, mode="reduce-overhead"), inputs)
    assert int(counters["inductor"].get("cudagraph_skips", 0)) == skips_before, "pt2cg did not capture"
    torch._dynamo.reset()  # also drops the cudagraph trees and their pool
    gc.collect()
    return peak


def _grace(f: Callable[..., Any], tmp_path: Path, **options: Any) -> Callable[..., Any]:
    # Default options unless given; an empty decision cache, so the variants are captured, checked, timed.
    return torch.compile(f, backend=GraceBackend(GraceOptions(cache_dir=str(tmp_path), **options)))


def _measure(
    name: str, f: Callable[..., Any], inputs: list[torch.Tensor], tmp_path: Path, **options: Any
) -> tuple[Callable[..., Any], int, int, list[dict[str, Any]]]:
    """(grace's compiled ``f``, its peak, pt2cg's peak, grace's stats), the figures saved as ``name``."""
    pt2cg = _pt2cg_peak(f, inputs)
    compiled = _grace(f, tmp_path, **options)
    peak = _peak(compiled, inputs)
    snapshot = stats.snapshot()
    _save(name, {"grace_peak": peak, "pt2cg_peak": pt2cg, "stats": snapshot})
    return compiled, peak, pt2cg, snapshot


def _assert_within_10_percent(peak: int, pt2cg: int, snapshot: list[dict[str, Any]]) -> None:
    assert peak <= 1.10 * pt2cg, (
        f"grace {peak / MIB:.0f} MiB vs pt2cg {pt2cg / MIB:.0f} MiB ({peak / pt2cg:.2f}x); "
        f"variants {[r['variant'] for r in snapshot]}"
    )


def _assert_same(got: Any, want: Any) -> None:
    got_t = [got] if isinstance(got, torch.Tensor) else list(got)
    want_t = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got_t) == len(want_t)
    for g, w in zip(got_t, want_t, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def _check_numerics_after_moves(
    compiled: Callable[..., Any], f: Callable[..., Any], inputs: list[torch.Tensor]
) -> None:
    with torch.no_grad():
        _assert_same(compiled(*inputs), f(*inputs))
        moved = [x.clone() for x in inputs]  # same values, new addresses
        _assert_same(compiled(*moved), f(*moved))
        del moved
        fresh = [torch.randn_like(x) for x in inputs]  # new values, new addresses
        for _ in range(2):
            _assert_same(compiled(*fresh), f(*fresh))


def _save(name: str, payload: dict[str, Any]) -> None:
    directory = os.environ.get("GRACE_TEST_ARTIFACTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))


def test_peak_within_10_percent_of_pt2cg_with_outputs_small_next_to_inputs(tmp_path: Path) -> None:
    inputs = _inputs()
    # pt2cg's peak is not held to >= U: 194 MiB on torch 2.11 (U = 256 MiB)
    compiled, peak, pt2cg, snapshot = _measure("memory_combine", combine, inputs, tmp_path)
    _assert_within_10_percent(peak, pt2cg, snapshot)
    _check_numerics_after_moves(compiled, combine, inputs)
    assert any(r["decision"] is not None for r in stats.snapshot())


def test_peak_within_10_percent_of_pt2cg_with_outputs_as_large_as_inputs(tmp_path: Path) -> None:
    """O = U: the graph's outputs (O) and comparison chunks, the reference in host memory and the
    no-graph samples taken before the capture; pt2cg reuses the memory of its input copies for the
    outputs (about U)."""
    inputs = _inputs()
    compiled, peak, pt2cg, snapshot = _measure("memory_each", each, inputs, tmp_path)
    _assert_within_10_percent(peak, pt2cg, snapshot)
    _check_numerics_after_moves(compiled, each, inputs)


def three_elementwise(x: torch.Tensor) -> torch.Tensor:
    """The suites' elementwise_64x1m: one 256 MiB input, one 256 MiB output (O = U)."""
    return torch.relu(x * 2.0 + 1.0)


def test_direct_pi_peak_within_10_percent_of_pt2cg_on_the_64x1m_workload(tmp_path: Path) -> None:
    """Option pi_direct: the PI graph is captured on the input itself and no graph with copies is made;
    with the reference in host memory the decision holds the graph's output (O); pt2cg holds its copy
    of the input and its output while its one kernel runs (U + O)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(INPUTS, NUMEL, device="cuda", generator=gen)]
    compiled, peak, pt2cg, snapshot = _measure(
        "memory_64x1m_direct", three_elementwise, inputs, tmp_path, pi_direct=True
    )
    graph_pi = [r for r in snapshot if r["variant"] == "graph_pi"]
    assert graph_pi, f"PI was not kept: {[(r['variant'], r['skip_reasons']) for r in snapshot]}"
    assert not any(s["code"] == "pi_direct_declined" for r in snapshot for s in r["skip_reasons"])
    _assert_within_10_percent(peak, pt2cg, snapshot)
    _check_numerics_after_moves(compiled, three_elementwise, inputs)
    assert {r["variant"] for r in stats.snapshot()} == {"graph_pi"}  # the moved inputs kept it


class _Linears(torch.nn.Module):
    """Four Linear(1024) layers on a batch of 1024: cuBLAS kernels with a workspace, 4 MiB activations."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.layers(x))


def test_matmul_peak_within_10_percent_of_pt2cg_with_one_cublas_workspace(tmp_path: Path) -> None:
    """Note: [cuBLAS workspaces] (grace.capture): the warm-up's workspace on the capture stream is dropped
    before the no-graph runs on the caller's stream allocate theirs, and the capture allocates its own in
    the graph's pool; holding both (about 32 MiB each on the H200) put grace at twice pt2cg's peak."""
    torch.manual_seed(0)
    model = _Linears().cuda().eval()
    inputs = [torch.randn(1024, 1024, device="cuda")]
    compiled, peak, pt2cg, snapshot = _measure("memory_linears", model, inputs, tmp_path)
    assert {r["variant"] for r in snapshot} & {"graph_pi", "graph_copies"}, snapshot
    _assert_within_10_percent(peak, pt2cg, snapshot)
    with torch.no_grad():
        for x in (inputs[0], torch.randn_like(inputs[0])):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)


class _ConvsThenLinears(torch.nn.Module):
    """An AlexNet-like stack: cuDNN convolutions (transient workspaces) before cuBLAS matmuls (a
    workspace kept per stream), on a batch of 16 images of 224x224."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 11, stride=4, padding=2),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2),
            torch.nn.Conv2d(64, 192, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2),
            torch.nn.Conv2d(192, 256, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(6),
        )
        self.head = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(256 * 36, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1000)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _calls_peak(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> int:
    """suites/harness.py's ``calls_peak_mem_bytes``: the peak of the calls after the first (which
    compiles: its figure depends on what Inductor's caches held) above the window's base."""
    base = memory_window_base(torch.device("cuda"))
    with torch.no_grad():
        fn(*inputs)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(CALLS - 1):
            fn(*inputs)
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def _pt2cg_calls_peak(model: Callable[..., Any], inputs: list[torch.Tensor]) -> int:
    peak = _calls_peak(torch.compile(model, mode="reduce-overhead"), inputs)
    torch._dynamo.reset()
    gc.collect()
    return peak


def test_convolutions_and_matmuls_peak_within_10_percent_of_pt2cg(tmp_path: Path) -> None:
    """Note: [cuBLAS workspaces] (grace.capture): every no-graph run grace makes (SCG's timed samples, the
    checks' references) starts without a cuBLAS workspace; one kept from the run before sat beside the
    convolutions' transient cuDNN workspaces (the suites' alexnet: 63.5 MiB against pt2cg's 33.3)."""
    torch.manual_seed(0)
    model = _ConvsThenLinears().cuda().eval()
    inputs = [torch.randn(16, 3, 224, 224, device="cuda")]
    pt2cg = _pt2cg_calls_peak(model, inputs)
    compiled = _grace(model, tmp_path)
    peak = _calls_peak(compiled, inputs)
    snapshot = stats.snapshot()
    _save("memory_convs_linears", {"grace_calls_peak": peak, "pt2cg_calls_peak": pt2cg, "stats": snapshot})
    assert {r["variant"] for r in snapshot} & {"graph_pi", "graph_copies"}, snapshot
    assert any(r["decision"] is not None for r in snapshot)
    _assert_within_10_percent(peak, pt2cg, snapshot)
    with torch.no_grad():
        for x in (inputs[0], torch.randn_like(inputs[0])):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)


def update_cache(cache: torch.Tensor, slot: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Writes one row of a large cache in place and returns a small reduction of it (as a decoder's
    static KV cache is used)."""
    cache.index_copy_(0, slot, row)
    return cache[:64].sum(dim=0)


def test_snapshots_of_a_large_mutated_input_stay_in_host_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grace.hostref.kept_copy: the deciding call's snapshots of a mutated input (to restore it and to
    compare it after the reference run) and the verified calls' copies go to host memory once they reach
    host_reference_bytes; on the device they were four copies of the 64 MiB cache. The copies are
    watched where decide and verify make them; both modes' peaks per call are saved with the stats."""
    import grace.decide
    import grace.hostref
    import grace.verify
    from grace.hostref import kept_copy

    cache = torch.zeros(1 << 14, 1024, device="cuda")  # 64 MiB
    devices: list[str] = []

    def watching(value: Any, min_bytes: int) -> Any:
        kept = kept_copy(value, min_bytes)
        tensors = kept if isinstance(kept, list) else [kept]
        devices.extend(
            t.device.type for t in tensors if isinstance(t, torch.Tensor) and t.numel() == cache.numel()
        )
        return kept

    for module in (grace.hostref, grace.decide, grace.verify):  # hostref's serves kept_inputs
        monkeypatch.setattr(module, "kept_copy", watching)
    reference_cache = cache.clone()
    inductor_peak = _peak_per_call(torch.compile(update_cache), cache.clone(), None)
    torch._dynamo.reset()
    peak = _peak_per_call(_grace(update_cache, tmp_path), cache, reference_cache)
    snapshot = stats.snapshot()
    _save(
        "memory_mutated_cache",
        {"grace_peak": peak, "inductor_peak": inductor_peak, "cache_bytes": cache.nbytes, "stats": snapshot},
    )
    assert {r["variant"] for r in snapshot} & {"graph_pi", "graph_copies"}, snapshot
    assert devices and set(devices) == {"cpu"}, devices  # every copy of the cache, none on the device


def _peak_per_call(fn: Callable[..., Any], cache: torch.Tensor, reference: torch.Tensor | None) -> int:
    """The highest peak of four calls of ``update_cache`` through ``fn``, each above what was allocated
    before it (the comparisons with eager, when ``reference`` is given, are outside the measure)."""
    peak = 0
    with torch.no_grad():
        for step in range(4):
            slot = torch.tensor([step], device="cuda")
            row = torch.full((1, 1024), float(step + 1), device="cuda")
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            got = fn(cache, slot, row)
            torch.cuda.synchronize()
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
            if reference is not None:
                want = update_cache(reference, slot, row)
                torch.testing.assert_close(got, want)
                torch.testing.assert_close(cache, reference)  # the update applied exactly once
    return peak


def test_layers_of_one_compiled_body_peak_within_10_percent_of_pt2cg(tmp_path: Path) -> None:
    """grace.rebind: a layer body compiled once and called for four layers' parameters. A graph per
    layer, each holding its outputs in its own pool, held four sets of outputs (about 1.4x pt2cg on
    DebertaForQuestionAnswering); rebound graphs share the first one's pool and outputs."""
    from test_rebind_gpu import Layered

    torch.manual_seed(0)
    model = Layered().cuda().eval()
    inputs = [torch.randn(128, 512, device="cuda")]
    pt2cg = _pt2cg_calls_peak(model, inputs)
    peaks = {}
    for rebind in (True, False):
        stats.reset()
        peaks[rebind] = _calls_peak(_grace(model, tmp_path / str(rebind), scg=False, rebind=rebind), inputs)
        snapshot = stats.snapshot()
        torch._dynamo.reset()
        gc.collect()
    _save("memory_rebind_layers", {"pt2cg": pt2cg, "rebind": peaks[True], "recapture": peaks[False]})
    assert peaks[True] < peaks[False], peaks
    _assert_within_10_percent(peaks[True], pt2cg, snapshot)
