"""suites.tp: shard math (simulated ranks in one process), TP models at world size 1 over a real gloo
group, the results format, and the torchrun entry point at TP-2 on CPU (and on GPUs where there are)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from suites.modes import Mode  # noqa: E402
from suites.tp import models  # noqa: E402
from suites.tp.collectives import TPGroup  # noqa: E402
from suites.tp.layers import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    ShardingError,
    shard_dim,
    shard_range,
    unshard_dim,
)
from suites.tp.results import TP_FORMAT, TP_FORMAT_VERSION, TPResultsError, read_results  # noqa: E402
from suites.tp.run import plan_mode  # noqa: E402
from suites.tp.workloads import INPUT_SEED, TP_WORKLOADS, get  # noqa: E402
from suites.workloads.registry import Tier  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def simulated(world: int) -> list[TPGroup]:
    return [TPGroup(rank=r, world_size=world) for r in range(world)]


# --- shard math ---------------------------------------------------------------------------------------


def test_shard_range_blocks_cover_the_dimension_in_rank_order() -> None:
    assert [shard_range(12, r, 4) for r in range(4)] == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]
    with pytest.raises(ShardingError, match=r"heads of size 6 does not split over 4 ranks.*--nproc-per-node"):
        shard_range(6, 0, 4, "heads")


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dim", [0, 1])
def test_unshard_inverts_shard(world: int, dim: int) -> None:
    full = torch.randn(8, 12, dtype=torch.float64)
    shards = [shard_dim(full, dim, tp) for tp in simulated(world)]
    assert all(s.is_contiguous() and s.untyped_storage().data_ptr() != full.data_ptr() for s in shards)
    assert torch.equal(unshard_dim(shards, dim), full)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_parallel_outputs_concatenate_to_the_full_output(world: int) -> None:
    full = torch.nn.Linear(8, 12, dtype=torch.float64)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    parts = [ColumnParallelLinear.from_full(full, tp)(x) for tp in simulated(world)]
    assert [p.shape[-1] for p in parts] == [12 // world] * world
    torch.testing.assert_close(unshard_dim(parts, -1), full(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_row_parallel_partial_sums_plus_bias_give_the_full_output(world: int) -> None:
    full = torch.nn.Linear(12, 8, dtype=torch.float64)
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    tps = simulated(world)
    x_parts = [x[..., shard_range(12, tp.rank, world)] for tp in tps]
    layers = [RowParallelLinear.from_full(full, tp) for tp in tps]
    total = sum(layer(xp) for layer, xp in zip(layers, x_parts, strict=True))
    if world > 1:  # a simulated rank leaves the bias to whoever reduces (added once, after the sum)
        total = total + full.bias
    torch.testing.assert_close(total, full(x), rtol=1e-12, atol=1e-12)


def test_column_then_row_is_the_megatron_mlp_at_world_2() -> None:
    up, down = torch.nn.Linear(8, 16, dtype=torch.float64), torch.nn.Linear(16, 8, dtype=torch.float64)
    x = torch.randn(4, 8, dtype=torch.float64)
    partials = [
        RowParallelLinear.from_full(down, tp)(torch.relu(ColumnParallelLinear.from_full(up, tp)(x)))
        for tp in simulated(2)
    ]
    torch.testing.assert_close(sum(partials) + down.bias, down(torch.relu(up(x))), rtol=1e-12, atol=1e-12)


def test_sharding_refuses_heads_the_world_does_not_divide() -> None:
    wl = get("xlnet_tp")
    assert wl.check_world_size(Tier.SMOKE, 3) is not None and "heads=4" in wl.check_world_size(Tier.SMOKE, 3)
    assert wl.check_world_size(Tier.STANDARD, 4) is None
    with pytest.raises(ShardingError, match="attention heads"):
        wl.shard(wl.build_full(wl.size(Tier.SMOKE)), TPGroup(rank=0, world_size=3))


# --- TP models at world size 1 over a real gloo group --------------------------------------------------


@pytest.fixture
def gloo_world_1(tmp_path: Path) -> Iterator[TPGroup]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    try:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    except Exception as exc:
        pytest.skip(f"gloo cannot start here: {type(exc).__name__}: {exc}")
    try:
        yield TPGroup(rank=0, world_size=1, group=dist.group.WORLD)
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(TP_WORKLOADS))
def test_tp_model_equals_reference_at_world_1(gloo_world_1: TPGroup, name: str) -> None:
    wl = get(name)
    size = wl.size(Tier.SMOKE)
    full = wl.build_full(size).double().requires_grad_(False)
    tp_model = wl.shard(full, gloo_world_1)
    (tokens,) = wl.inputs(size, INPUT_SEED)
    with torch.no_grad():
        torch.testing.assert_close(tp_model(tokens), full(tokens), rtol=1e-12, atol=1e-12)
    assert any(isinstance(m, RowParallelLinear) and m.group is not None for m in tp_model.modules())


def test_collectives_trace_into_one_dynamo_graph(gloo_world_1: TPGroup) -> None:
    wl = get("mlp_decode_tp")
    size = wl.size(Tier.SMOKE)
    tp_model = wl.shard(wl.build_full(size).requires_grad_(False), gloo_world_1)
    with torch.no_grad():
        explained = torch._dynamo.explain(tp_model)(*wl.inputs(size, INPUT_SEED))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert [op for op in ops if "_c10d_functional" in op] == [
        "_c10d_functional.all_reduce",
        "_c10d_functional.wait_tensor",
    ] * size["layers"]


def test_build_is_reproducible_and_sharding_leaves_the_reference_alone() -> None:
    wl = get("xlnet_tp")
    size = wl.size(Tier.SMOKE)
    a, b = wl.build_full(size), wl.build_full(size)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    before = {k: v.clone() for k, v in a.state_dict().items()}
    shards = [wl.shard(a, tp) for tp in simulated(2)]
    assert all(torch.equal(v, a.state_dict()[k]) for k, v in before.items())
    q = [s.layers[0].q.weight for s in shards]
    assert torch.equal(unshard_dim(q, 0), a.layers[0].q.weight) and shards[1].layers[0].heads == 2
    assert isinstance(shards[0].layers[0].o, RowParallelLinear)
    assert wl.code_hash == get("xlnet_tp").code_hash and wl.code_hash != get("mlp_decode_tp").code_hash


def test_rel_shift_aligns_position_scores_on_the_distance_i_minus_j() -> None:
    seq = 4  # position index p of relative_positions holds the distance seq - p
    raw = torch.arange(seq * 2 * seq, dtype=torch.float64).view(1, 1, seq, 2 * seq)
    shifted = models.rel_shift(raw, seq)
    assert shifted.shape == (1, 1, seq, seq)
    for i in range(seq):
        for j in range(seq):
            assert shifted[0, 0, i, j] == raw[0, 0, i, seq - i + j]  # distance seq - (seq - i + j) = i - j
    assert torch.equal(models.relative_positions(seq, 8)[seq, 4:], torch.ones(4))  # distance 0: cos 0


# --- modes, results format ----------------------------------------------------------------------------


def test_grace_runs_its_no_cuda_path_on_cpu_and_pt2cg_is_skipped() -> None:
    runs_as, reason = plan_mode(Mode.GRACE, "cpu")
    assert runs_as is Mode.GRACE_CPU
    assert plan_mode(Mode.EAGER, "cpu") == (Mode.EAGER, None)
    runs_as, reason = plan_mode(Mode.PT2CG, "cpu")
    assert runs_as is Mode.PT2CG and reason is not None and "no CUDA device" in reason


def test_results_reader_refuses_other_formats_and_newer_versions(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": TP_FORMAT, "format_version": TP_FORMAT_VERSION, "modes": {}}))
    assert read_results(path)["modes"] == {}
    path.write_text(json.dumps({"format": TP_FORMAT, "format_version": TP_FORMAT_VERSION + 1}))
    with pytest.raises(TPResultsError, match="upgrade grace-matrix"):
        read_results(path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(TPResultsError, match="not a TP results file"):
        read_results(path)


# --- the entry point under torchrun -------------------------------------------------------------------

GLOO_START_FAILURES = ("init_process_group", "Gloo connectFullMesh", "Address already in use", "EADDRINUSE")


def launch(
    out: Path, nproc: int, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1", "OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "suites.tp.run", *args, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, out


@pytest.mark.slow
def test_torchrun_tp2_on_cpu_eager_and_inductor_pass(tmp_path: Path) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    proc, out = launch(
        tmp_path / "out", 2, "--workload", "xlnet_tp", "--modes", "eager,inductor,pt2cg", "--device", "cpu",
        "--tier", "smoke", "--timeout-s", "120", timeout=300,
    )  # fmt: skip
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    path = out / "xlnet_tp-tp2-cpu.json"
    if proc.returncode != 0 and not path.exists() and any(s in log for s in GLOO_START_FAILURES):
        pytest.skip(f"gloo could not start two processes here: {log[-600:]}")
    assert proc.returncode == 0, log
    data = read_results(path)
    assert (data["world_size"], data["backend"], data["device"]) == (2, "gloo", "cpu")
    assert data["sharding"]["status"] == "pass" and data["reference"]["status"] == "pass"
    modes = data["modes"]
    assert modes["eager"]["status"] == "pass", modes["eager"]
    assert modes["inductor"]["status"] == "pass", modes["inductor"]
    assert modes["pt2cg"]["status"] == "skip" and "no CUDA device" in modes["pt2cg"]["reason"]
    checks = modes["inductor"]["checks"]
    assert sorted(checks) == ["inputs", "inputs_again", "moved_inputs"]
    assert all([c["rank"] for c in per_set] == [0, 1] for per_set in checks.values())
    assert modes["inductor"]["compile_facts"].get("graph_breaks") == 0
    assert data["timing"]["status"] == "skip"


@pytest.mark.gpu
@pytest.mark.slow
def test_torchrun_on_gpus_grace_and_pt2cg_pass(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices, {torch.cuda.device_count()} visible")
    proc, out = launch(
        tmp_path / "out", 2, "--workload", "mlp_decode_tp", "--modes", "eager,inductor,pt2cg,grace",
        "--device", "cuda", "--tier", "smoke", "--samples", "5", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = read_results(out / "mlp_decode_tp-tp2-cuda.json")
    statuses = {m: r["status"] for m, r in data["modes"].items()}
    assert statuses == dict.fromkeys(statuses, "pass"), {m: r["reason"] for m, r in data["modes"].items()}
    assert data["timing"]["status"] == "ok" and "inductor" in data["timing"]["speedup_vs_inductor"]


@pytest.mark.skipif(sys.platform == "win32", reason="needs bash")
def test_tp_check_script_keeps_multicast_off_and_skips_sizes_without_gpus(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "gpu" / "tp_check.sh"
    assert "export NCCL_NVLS_ENABLE=0" in script.read_text()
    if torch.cuda.is_available():
        pytest.skip("a dry run only where no GPU is visible")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    env["GRACE_SUITES_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TP-2 skipped: only 0 GPU(s) visible" in (tmp_path / "out" / "summary.txt").read_text()
    assert "NCCL_NVLS_ENABLE=0" in (tmp_path / "out" / "environment.txt").read_text()
