"""grace on a CUDA device with threads, streams and more signatures than graphs: every value a call
returns equals eager's on the same input (float64, rtol = atol = 1e-9). All tests carry the ``gpu``
marker; tests/test_concurrency.py shows the same rules on CPU."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from grace import pools, stats
from grace.backend import GraceBackend
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

TOL = {"rtol": 1e-9, "atol": 1e-9}
GRAPHS = ("graph_copies", "graph_pi")
WIDTH = 64
# torch.cuda._sleep spins this many GPU clock cycles: about 0.1 s on an H200 (about 1.98 GHz).
SLEEP_CYCLES = 200_000_000


def _options(tmp_path: Path, **changes: Any) -> GraceOptions:
    values: dict[str, Any] = {"cache_dir": str(tmp_path), "scg": False, "scg_samples": 5, "scg_warmup": 1}
    values.update(changes)
    return GraceOptions(**values)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return (
        torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()
        )
        .cuda()
        .double()
        .eval()
    )


class _TwoPieces(torch.nn.Module):
    """Two compiled pieces (a graph break between them): two runners, whose warm-ups and captures share
    grace's side stream (Note: [One side stream] in grace.capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
        self.second = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h) + h


def _two_pieces() -> torch.nn.Module:
    torch.manual_seed(0)
    return _TwoPieces().cuda().double().eval()


def _input(rows: int = 16, generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randn(rows, WIDTH, device="cuda", dtype=torch.float64, generator=generator)


def _warm(compiled: Any, model: torch.nn.Module, rows: int = 16, calls: int = 6) -> None:
    """Warm-up, deciding call and the verified first calls (one at new addresses), each checked."""
    for _ in range(calls):
        x = _input(rows)
        torch.testing.assert_close(compiled(x), model(x), **TOL)


def _graph_records() -> list[dict[str, Any]]:
    return [r for r in stats.snapshot() if r["variant"] in GRAPHS]


# --- threads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pieces", [1, 2])
@pytest.mark.parametrize("clone", [True, False], ids=["clone", "no-clone"])
@pytest.mark.parametrize("threads", [2, 4])
def test_threads_calling_one_compiled_model_get_eager_values(
    threads: int, clone: bool, pieces: int, tmp_path: Path
) -> None:
    """Each thread calls the model 40 times with inputs of its own and compares every output with
    eager's while it holds it; with ``clone_outputs=False`` another thread's call meanwhile runs without
    the graph (Note: [Outputs and threads] in grace.capture). Two pieces: the threads' calls also
    interleave between the two runners of one model."""
    model = _model() if pieces == 1 else _two_pieces()
    compiled = torch.compile(model, backend=GraceBackend(_options(tmp_path, clone_outputs=clone)))
    with torch.no_grad():
        _warm(compiled, model)  # compiled and decided before the threads start
    assert _graph_records(), stats.snapshot()
    stats.reset()
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def work(k: int) -> None:
        try:
            generator = torch.Generator(device="cuda").manual_seed(1000 + k)
            with torch.no_grad():  # grad mode is per thread
                barrier.wait(timeout=120)
                for call in range(40):
                    x = _input(generator=generator)
                    out = compiled(x)
                    want = model(x)
                    if not torch.allclose(out, want, **TOL):
                        errors.append(f"thread {k} call {call}: max error {(out - want).abs().max().item()}")
                    del out
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in workers), "a thread did not finish in 300 s"
    assert errors == [], errors
    records = stats.snapshot()
    assert sum(r["calls"] for r in records) == 40 * threads * pieces, records
    if clone:  # nothing of the pool is handed out: the calls replay
        assert sum(r["graph_launches"] for r in records) > 0, records


# --- streams ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pi", [True, False], ids=["pi", "copies"])
def test_a_call_on_another_stream_waits_for_reads_still_queued_on_the_first(pi: bool, tmp_path: Path) -> None:
    """Stream A runs the model, then a slow read of its output (0.1 s of sleep, then a clone); stream B
    runs it next on other inputs without waiting for A itself: B's replay must not overwrite the output
    before A's clone has read it (Note: [Stream order] in grace.capture)."""
    model = _model()
    compiled = torch.compile(model, backend=GraceBackend(_options(tmp_path, pi=pi)))
    with torch.no_grad():
        _warm(compiled, model)
        xa, xb = _input(), _input()
        want_a, want_b = model(xa), model(xb)
        torch.cuda.synchronize()
        stats.reset()
        first, second = torch.cuda.Stream(), torch.cuda.Stream()
        for stream in (first, second):
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(first):
            out_a = compiled(xa)
            torch.cuda._sleep(SLEEP_CYCLES)
            seen_a = out_a.clone()
        with torch.cuda.stream(second):
            out_b = compiled(xb)
            seen_b = out_b.clone()
        torch.cuda.synchronize()
    torch.testing.assert_close(seen_a, want_a, **TOL)
    torch.testing.assert_close(seen_b, want_b, **TOL)
    (record,) = _graph_records()
    assert record["graph_launches"] == 2, record  # both calls replayed the graph


# --- more signatures than graphs -------------------------------------------------------------------


def test_an_evicted_graphs_pool_goes_back_to_the_device(tmp_path: Path) -> None:
    """A graph evicted with none of its outputs held leaves no reserved memory behind: its pool's
    segments are handed back at once (grace.pools), not left cached until ``empty_cache``."""
    model = _model()
    compiled = torch.compile(
        model, backend=GraceBackend(_options(tmp_path, max_graphs_per_callable=1)), dynamic=True
    )
    big_rows = 1 << 17  # 64 MiB per float64 activation: the big graph's pool holds several of them
    with torch.no_grad():
        x = _input(big_rows)
        for _ in range(4):
            torch.testing.assert_close(compiled(x), model(x), **TOL)
        del x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        with_big = torch.cuda.memory_reserved()
        assert _graph_records(), stats.snapshot()
        small = _input(8)
        for _ in range(4):  # evicts the big graph; no output of it is held
            torch.testing.assert_close(compiled(small), model(small), **TOL)
        torch.cuda.synchronize()
        released = [r for r in stats.snapshot() if r["released"] and r["variant"] in GRAPHS]
        assert released, stats.snapshot()
        assert torch.cuda.memory_reserved() < with_big - (64 << 20), (with_big, torch.cuda.memory_reserved())


def test_outputs_of_evicted_graphs_stay_intact_while_held(tmp_path: Path) -> None:
    """Five batch sizes through one compiled callable that keeps two graphs: the last output of each
    size is kept while later sizes evict its graph, memory is allocated and written meanwhile, and every
    kept output still equals eager's at the end (grace.pools); dropped, their pools are released."""
    model = _model()
    compiled = torch.compile(
        model, backend=GraceBackend(_options(tmp_path, max_graphs_per_callable=2)), dynamic=True
    )
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    waiting = pools.waiting()  # (outputs other tests still hold)
    with torch.no_grad():
        for rows in (8, 16, 24, 32, 40):
            x = _input(rows)
            for _ in range(4):  # warm-up, deciding call, steady calls: the last output is kept
                out = compiled(x)
            kept.append((x, out))
            del out
        released = [r for r in stats.snapshot() if r["released"] and r["variant"] in GRAPHS]
        assert len(released) >= 1, stats.snapshot()
        assert pools.waiting() >= waiting + len(released)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        filler = [torch.full((k * 4, WIDTH), 7.0, device="cuda", dtype=torch.float64) for k in range(1, 64)]
        torch.cuda.synchronize()
        for rows, (x, out) in zip((8, 16, 24, 32, 40), kept, strict=True):
            torch.testing.assert_close(out, model(x), **TOL, msg=f"batch of {rows}")
        del filler
        kept.clear()
        x = _input(40)
        torch.testing.assert_close(compiled(x), model(x), **TOL)  # the next call releases them
    assert pools.waiting() == waiting
