"""Training under grace on a CUDA device: AOTAutograd's forward and backward graphs run in CUDA graphs,
and every step's loss, gradients and parameters equal eager's (float64, tolerance 1e-9; bf16 autocast
2e-2), including the call patterns that meet Note: [Outputs autograd keeps]: two forwards before one
backward, gradient accumulation without zeroing, dropout, a compiled optimizer step. Marker ``gpu``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import grace
import grace.runner
from grace import backend, stats
from grace.compat import torch as torch_compat
from grace.options import GraceOptions

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_grace")]

DEVICE = torch.device("cuda", 0)
TOL = {"rtol": 1e-9, "atol": 1e-9}


class Net(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float64, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128, dtype=dtype)
        self.fc2 = torch.nn.Linear(128, 64, dtype=dtype)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.nn.functional.gelu(self.fc1(x)))
        return (self.fc2(h) - x).pow(2).mean()


@pytest.fixture
def graphs() -> Iterator[list[Any]]:
    sink = backend.collect_compiled_graphs()
    yield sink
    backend.stop_collecting(sink)


def _pair(
    tmp_path: Path, dtype: torch.dtype = torch.float64, dropout: float = 0.0, **options: Any
) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
    torch.manual_seed(0)
    eager = Net(dtype, dropout).to(DEVICE)
    model = copy.deepcopy(eager)
    opts = GraceOptions(cache_dir=str(tmp_path), scg_samples=3, scg_warmup=0, training=True, **options)
    return eager, model, grace.compile(model, options=opts)


def _batch(step: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(100 + step)
    return torch.randn(16, 64, dtype=dtype, device=DEVICE, generator=generator)


def _same_grads(eager: torch.nn.Module, model: torch.nn.Module, what: str, **tol: Any) -> None:
    for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
        assert q.grad is not None, f"{what}: no gradient for {name}"
        torch.testing.assert_close(q.grad, p.grad, **(tol or TOL), msg=lambda m, n=name: f"{what} {n}: {m}")


def _same_params(eager: torch.nn.Module, model: torch.nn.Module, what: str, **tol: Any) -> None:
    for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, **(tol or TOL), msg=lambda m, n=name: f"{what} {n}: {m}")


def _graph_launches(graphs: list[Any]) -> dict[str, int]:
    """Graph launches per role of the training graphs compiled in this test."""
    roles = {info.callable_id: info.role for info in graphs}
    launches: dict[str, int] = {}
    for record in stats.snapshot():
        role = roles.get(record["callable_id"])
        if role is not None:
            launches[role] = launches.get(role, 0) + record["graph_launches"]
    return launches


def _why(graphs: list[Any]) -> str:
    """Role, variant, launches and skip reasons of each training graph's slots, one line each and in
    full (a failure message pytest does not shorten)."""
    roles = {info.callable_id: info.role for info in graphs}
    return "\n".join(
        _record_line(r, roles[r["callable_id"]]) for r in stats.snapshot() if r["callable_id"] in roles
    )


def _record_line(record: dict[str, Any], role: str) -> str:
    reasons = "; ".join(f"{s['code']}: {s['detail']}" for s in record["skip_reasons"])
    counts = f"launches {record['graph_launches']}, held-output calls {record['held_output_calls']}"
    return f"{role} {record['variant']} ({counts}): {reasons or 'no skip'}"


def _step_both(
    eager: torch.nn.Module, model: torch.nn.Module, optimizers: tuple[Any, ...], step: int
) -> None:
    """Gradients equal, both optimizers step and zero (``set_to_none``), parameters equal."""
    _same_grads(eager, model, f"step {step}")
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    _same_params(eager, model, f"after step {step}")


def _train(
    eager: torch.nn.Module,
    model: torch.nn.Module,
    compiled: Any,
    steps: int,
    before_step: Callable[[int], None] = lambda step: None,
) -> None:
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_g = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x = _batch(step)
        before_step(step)
        loss_e = eager(x)
        loss_e.backward()
        before_step(step)
        loss_g = compiled(x)
        loss_g.backward()
        torch.testing.assert_close(loss_g, loss_e, **TOL, msg=lambda m, s=step: f"loss, step {s}: {m}")
        _step_both(eager, model, (opt_e, opt_g), step)


@pytest.mark.parametrize("step_pool", [False, True])
def test_training_steps_equal_eagers_and_run_in_cuda_graphs(
    tmp_path: Path, graphs: list[Any], step_pool: bool
) -> None:
    eager, model, compiled = _pair(tmp_path, scg=False, step_pool=step_pool)
    _train(eager, model, compiled, steps=8)
    launches = _graph_launches(graphs)
    assert launches.get("forward", 0) >= 5 and launches.get("backward", 0) >= 5, f"{launches}\n{_why(graphs)}"


@pytest.mark.parametrize("step_pool", [False, True])
def test_a_backward_reusing_its_saved_tensors_memory_equals_eager(
    tmp_path: Path, graphs: list[Any], step_pool: bool
) -> None:
    """Option ``donated_buffers``: the backward writes its saved tensors' memory, so it counts them as
    inputs it writes; every step still equals eager's and both graphs replay."""
    eager, model, compiled = _pair(tmp_path, step_pool=step_pool, donated_buffers=True)
    _train(eager, model, compiled, steps=8)
    launches = _graph_launches(graphs)
    assert launches.get("forward", 0) >= 5 and launches.get("backward", 0) >= 5, f"{launches}\n{_why(graphs)}"
    written = [r.plan.mutated_indices for r in list(grace.runner._live_runners) if r.plan.mutated_indices]
    assert written, "no backward was given donated saved tensors: this test would check nothing"


def test_a_step_pool_lends_its_graphs_outputs(tmp_path: Path, graphs: list[Any]) -> None:
    """Note: [Outputs a shared pool lends] in grace.outputs: in the step's pool the forward and the
    backward give up owning their outputs once handed out; every step equals eager's, and after the last
    one no storage they were handed out from is alive: their memory is the allocator's again."""
    eager, model, compiled = _pair(tmp_path, scg=False, step_pool=True)
    _train(eager, model, compiled, steps=6)
    families = [
        slot.graph.outputs_owner.family
        for runner in list(grace.runner._live_runners)
        for slot in runner.slots.values()
        if slot.graph is not None
    ]
    lent = [family for family in families if family.owners]
    assert lent, _why(graphs)
    alive = [torch_compat.storage_use_count(o) for f in lent for o in f.owners if o is not None]
    assert not any(alive), alive


def test_training_with_selective_graphs_equals_eager(tmp_path: Path, graphs: list[Any]) -> None:
    eager, model, compiled = _pair(tmp_path)
    _train(eager, model, compiled, steps=8)
    launched = {role for role, count in _graph_launches(graphs).items() if count}
    assert {"forward", "backward"} <= launched, _why(graphs)


def _private_pools() -> set[Any]:
    return {seg["segment_pool_id"] for seg in torch.cuda.memory_snapshot()} - {(0, 0)}


@pytest.mark.parametrize(
    ("output_sets", "share_pool"), [(1, False), (16, False), (16, True), (16, "step"), (1, "step")]
)
def test_two_forwards_before_one_backward(
    tmp_path: Path, graphs: list[Any], output_sets: int, share_pool: bool | str
) -> None:
    """The second forward may not replay over the first one's saved tensors (its backward is pending):
    with one set of outputs it runs without the graph; with more (Note: [Output sets] in grace.outputsets) it
    replays a second capture with outputs of its own, in a pool of its own or, with
    ``output_sets_share_pool``, in the first set's (Note: [Graphs in one pool] in grace.poolgroups):
    then the forward's and the backward's sets take one pool each; with ``step_pool``, every training
    graph takes one pool (Note: [A training step in one pool])."""
    pools_before = _private_pools()
    kept_out_before = stats.fallback_counts().get("pool_of_its_own", 0)
    eager, model, compiled = _pair(
        tmp_path,
        scg=False,
        max_output_sets=output_sets,
        output_sets_share_pool=share_pool is True,
        step_pool=share_pool == "step",
    )
    for step in range(5):
        a, b = _batch(2 * step), _batch(2 * step + 1)
        (eager(a) + 2 * eager(b)).backward()
        (compiled(a) + 2 * compiled(b)).backward()
        _same_grads(eager, model, f"step {step}")
        for module in (eager, model):
            module.zero_grad(set_to_none=True)
    forward = [r for r in stats.snapshot() if r["callable_id"] in _ids(graphs, "forward")]
    held = sum(r["held_output_calls"] for r in forward)
    if output_sets == 1:
        assert held >= 3, _why(graphs)
    else:
        assert held == 0 and max(r["graphs_held"] for r in forward) == 2, _why(graphs)
        assert sum(r["graph_launches"] for r in forward) >= 6, _why(graphs)
    if share_pool:
        torch.cuda.empty_cache()  # released candidates' pools go; the kept graphs' stay
        new_pools = _private_pools() - pools_before
        # A capture made while an output lent from the shared pool is held gets a pool of its own, with
        # its reason (Note: [Outputs a shared pool lends] in grace.outputs), counted once per capture (a
        # slot's record lists each reason once).
        elsewhere = stats.fallback_counts().get("pool_of_its_own", 0) - kept_out_before
        assert len(new_pools) <= (1 if share_pool == "step" else 2) + elsewhere, (new_pools, _why(graphs))


def _ids(graphs: list[Any], role: str) -> set[int]:
    return {info.callable_id for info in graphs if info.role == role}


@pytest.mark.parametrize("step_pool", [False, True])
def test_gradient_accumulation_without_zeroing(tmp_path: Path, graphs: list[Any], step_pool: bool) -> None:
    """Micro-batches accumulate into ``.grad``: a backward may not replay over a gradient that is a
    parameter's ``.grad`` already, nor, in the step's pool, a forward over it."""
    eager, model, compiled = _pair(tmp_path, scg=False, step_pool=step_pool)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        for micro in range(3):
            x = _batch(10 * step + micro)
            eager(x).backward()
            compiled(x).backward()
        _step_both(eager, model, (opt_e, opt_g), step)
    assert _graph_launches(graphs).get("backward", 0) >= 4, _why(graphs)


def test_dropout_in_training_draws_what_eager_draws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Inductor's ``fallback_random`` the masks are eager's when the generator is where eager leaves
    it: grace's extra runs of a training graph must leave it there."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "fallback_random", True)
    eager, model, compiled = _pair(tmp_path, dropout=0.2, scg=False)

    def seed(step: int) -> None:
        torch.manual_seed(1000 + step)

    _train(eager, model, compiled, steps=6, before_step=seed)


def test_bf16_autocast_training_matches_eager(tmp_path: Path, graphs: list[Any]) -> None:
    eager, model, compiled = _pair(tmp_path, dtype=torch.float32, scg=False)
    tol = {"rtol": 2e-2, "atol": 2e-2}
    for step in range(5):
        x = _batch(step, torch.float32)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_e = eager(x)
            loss_g = compiled(x)
        loss_e.backward()
        loss_g.backward()
        torch.testing.assert_close(loss_g, loss_e, **tol)
        _same_grads(eager, model, f"step {step}", **tol)
        for module in (eager, model):
            module.zero_grad(set_to_none=True)
    launches = _graph_launches(graphs)
    assert launches.get("forward", 0) >= 2 and launches.get("backward", 0) >= 2, f"{launches}\n{_why(graphs)}"


def test_fp16_autocast_with_a_grad_scaler_matches_eager(tmp_path: Path, graphs: list[Any]) -> None:
    """float16 autocast with ``torch.amp.GradScaler``: the first scale overflows the float16 backward, so
    both runs skip that step and back off; later steps grow the scale. The scales, the skipped steps and
    the parameters equal eager's after every step, and forward and backward replay in graphs."""
    eager, model, compiled = _pair(tmp_path, dtype=torch.float32, scg=False)
    tol = {"rtol": 2e-2, "atol": 2e-2}
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, model)]
    scalers = [
        torch.amp.GradScaler("cuda", init_scale=2.0**24, backoff_factor=2.0**-10, growth_interval=2)
        for _ in range(2)
    ]
    scales: list[tuple[float, float]] = []
    for step in range(7):
        x = _batch(step, torch.float32)
        for run, opt, scaler in zip((eager, compiled), opts, scalers, strict=True):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = run(x)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        scales.append((scalers[0].get_scale(), scalers[1].get_scale()))
        assert scales[-1][0] == scales[-1][1], (step, scales)
        _same_params(eager, model, f"after step {step}", **tol)
    assert scales[0][0] == 2.0**14 and max(s for s, _ in scales) > 2.0**14, scales  # backed off, then grew
    launches = _graph_launches(graphs)
    assert launches.get("forward", 0) >= 2 and launches.get("backward", 0) >= 2, f"{launches}\n{_why(graphs)}"


def test_a_compiled_optimizer_step_runs_once_per_call(tmp_path: Path) -> None:
    """``torch.compile(opt.step)``: a graph that mutates its inputs (parameters, moments, steps) is never
    run more often than the caller calls it, whatever grace decides and checks."""
    torch.manual_seed(0)
    eager = Net(torch.float32).to(DEVICE)
    model = copy.deepcopy(eager)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2, capturable=True)
    opt_g = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    options = GraceOptions(cache_dir=str(tmp_path), scg_samples=3, scg_warmup=0)
    step = torch.compile(opt_g.step, backend=backend.GraceBackend(options))
    for k in range(5):
        x = _batch(k, torch.float32)
        eager(x).backward()
        model(x).backward()
        opt_e.step()
        step()
        opt_e.zero_grad(set_to_none=True)
        opt_g.zero_grad(set_to_none=True)
        _same_params(eager, model, f"after step {k}", rtol=1e-4, atol=1e-5)  # a second run: 1e-2 off


class Attention(torch.nn.Module):
    """One self-attention layer whose SDPA with dropout runs memory-efficient attention (float32:
    flash attention takes no float32), which returns its Philox seeds (grace.philox)."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64)
        self.proj = torch.nn.Linear(64, 64)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        h = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return (self.proj(h.transpose(1, 2).reshape_as(x)) - x).pow(2).mean()


@pytest.mark.parametrize(("dropout", "step_pool"), [(0.3, False), (0.0, False), (0.3, True)])
def test_attention_dropout_runs_both_graphs_and_draws_eagers_masks(
    tmp_path: Path, graphs: list[Any], dropout: float, step_pool: bool
) -> None:
    """Note: [Philox seeds of attention]: a replayed forward hands its backward device seeds, a plain
    run host seeds; both graphs are captured, and every step equals eager's from the same generator.
    With dropout 0 in training the seeds are left undefined and no check compares them (Note: [Random
    state of an op that draws nothing]). With ``step_pool`` the backward given host seeds in the first
    step decides in the forward's deciding step (Note: [Warm-up per signature, not per placement] in
    grace.runner), so its capture goes into the step's pool."""
    kept_out_before = stats.fallback_counts().get("pool_of_its_own", 0)
    torch.manual_seed(0)
    eager = Attention(dropout).to(DEVICE)
    model = copy.deepcopy(eager)
    opts = GraceOptions(
        cache_dir=str(tmp_path), scg_samples=3, scg_warmup=0, training=True, scg=False, step_pool=step_pool
    )
    compiled = grace.compile(model, options=opts)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(model.parameters(), lr=0.05)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    for step in range(8):
        generator = torch.Generator(device=DEVICE).manual_seed(200 + step)
        x = torch.randn(4, 32, 64, device=DEVICE, generator=generator)
        torch.manual_seed(1000 + step)
        loss_e = eager(x)
        loss_e.backward()
        torch.manual_seed(1000 + step)
        loss_g = compiled(x)
        loss_g.backward()
        torch.testing.assert_close(loss_g, loss_e, **tol, msg=lambda m, s=step: f"loss, step {s}: {m}")
        _same_grads(eager, model, f"step {step}", **tol)
        for opt in (opt_e, opt_g):
            opt.step()
            opt.zero_grad(set_to_none=True)
        _same_params(eager, model, f"after step {step}", **tol)
    launches = _graph_launches(graphs)
    assert launches.get("forward", 0) >= 2 and launches.get("backward", 0) >= 2, f"{launches}\n{_why(graphs)}"
    kept_out = stats.fallback_counts().get("pool_of_its_own", 0) - kept_out_before
    assert kept_out == 0, _why(graphs)
