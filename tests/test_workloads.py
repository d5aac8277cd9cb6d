"""The workload registry and every registered workload at the smoke tier on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import suites.workloads as registry  # noqa: E402
from suites.tensors import clone_inputs, flatten, variant_inputs  # noqa: E402
from suites.workloads import Tag, Tier, WorkloadError, WorkloadUnavailable  # noqa: E402
from suites.workloads.llm import DecodeStep  # noqa: E402
from suites.workloads.pyhpc import TurbulentKineticEnergy, UnescoDensity  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAPER_MODELS = {
    "XLNetLMHeadModel", "MT5ForConditionalGeneration", "MobileBertForQuestionAnswering",
    "DebertaV2ForQuestionAnswering", "DebertaForQuestionAnswering", "BlenderbotSmallForConditionalGeneration",
    "DistilGPT2", "lcnet_050", "densenet121", "alexnet", "pyhpc_equation_of_state",
    "pyhpc_turbulent_kinetic_energy", "nvidia_deeprecommender", "dlrm", "speech_transformer",
}  # fmt: skip


@pytest.fixture
def scratch() -> Iterator[list[str]]:
    """Names registered by a test; removed afterwards so the registry stays as it was."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def _toy(size: Any, device: Any, dtype: Any) -> tuple[Any, tuple[Any, ...]]:
    return torch.nn.Identity(), (torch.ones(size["n"], device=device, dtype=dtype),)


SIZES = {"smoke": {"n": 1}, "standard": {"n": 2}, "full": {"n": 3}}


class TestRegistry:
    def test_at_least_twenty_workloads_with_paper_models(self) -> None:
        names = registry.names()
        assert len(names) >= 20 and len(set(names)) == len(names)
        assert set(names) >= PAPER_MODELS

    def test_every_workload_is_complete(self) -> None:
        for wl in registry.all_workloads():
            assert set(wl.sizes) == set(Tier), wl.name
            assert wl.tags and all(isinstance(t, Tag) for t in wl.tags), wl.name
            assert wl.description, wl.name

    def test_techniques_are_covered(self) -> None:
        for tag in (Tag.CGCT, Tag.PI, Tag.SCG, Tag.VENDOR, Tag.DYNAMIC, Tag.MUTATION):
            assert registry.select(tags=[tag]), tag

    def test_register_get_select(self, scratch: list[str]) -> None:
        registry.workload("toy_a", sizes=SIZES, tags=[Tag.SYNTHETIC])(_toy)
        scratch.append("toy_a")
        wl = registry.get("toy_a")
        _, inputs = wl.factory("standard")("cpu", torch.float32)
        assert inputs[0].shape == (2,)
        assert [w.name for w in registry.select("toy_*")] == ["toy_a"]
        assert registry.select("toy_a", tags=[Tag.VISION]) == []
        assert wl.ref("smoke").to_dict() == {
            "name": "toy_a", "tier": "smoke", "tags": ["synthetic"], "code_hash": wl.code_hash
        }  # fmt: skip

    def test_errors_name_the_fix(self, scratch: list[str]) -> None:
        registry.workload("toy_b", sizes=SIZES)(_toy)
        scratch.append("toy_b")
        with pytest.raises(ValueError, match="already registered"):
            registry.workload("toy_b", sizes=SIZES)(_toy)
        with pytest.raises(WorkloadError, match="did you mean toy_b"):
            registry.get("toy")
        with pytest.raises(WorkloadError, match="no workload matches"):
            registry.select("no_such_*")
        with pytest.raises(ValueError, match="no size for tier"):
            registry.workload("toy_c", sizes={"smoke": {"n": 1}})(_toy)


class TestCodeHash:
    def test_stable_and_distinct(self) -> None:
        hashes = {wl.name: wl.code_hash for wl in registry.all_workloads()}
        assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes.values())
        assert len(set(hashes.values())) == len(hashes)
        assert hashes == {wl.name: registry.code_hash(wl) for wl in registry.all_workloads()}

    def test_same_in_a_fresh_process(self) -> None:
        code = (
            "import json, suites.workloads as w; "
            "print(json.dumps({x.name: x.code_hash for x in w.all_workloads()}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        ).stdout  # fmt: skip
        assert json.loads(out.strip().splitlines()[-1]) == {
            wl.name: wl.code_hash for wl in registry.all_workloads()
        }

    def test_changes_with_sizes_and_name(self, scratch: list[str]) -> None:
        registry.workload("toy_d", sizes=SIZES)(_toy)
        registry.workload("toy_e", sizes={**SIZES, "full": {"n": 4}})(_toy)
        registry.workload("toy_f", sizes=SIZES)(_toy)
        scratch += ["toy_d", "toy_e", "toy_f"]
        d, e, f = (registry.get(n).code_hash for n in ("toy_d", "toy_e", "toy_f"))
        assert len({d, e, f}) == 3


@pytest.mark.parametrize("name", registry.names())
def test_smoke_builds_and_runs_eager_on_cpu(name: str) -> None:
    wl = registry.get(name)
    try:
        model, inputs = wl.factory("smoke")("cpu", torch.float32)
    except WorkloadUnavailable as exc:
        # only an optional package may be missing, and the reason must say which one
        assert any(exc.package.split(".")[0] == req for req in wl.requires), (exc.package, wl.requires)
        pytest.skip(f"{'model_fail_to_load' if exc.installed else 'skip'}: {exc}")
    with torch.no_grad():
        first = flatten(model(*clone_inputs(inputs)))
        second = flatten(model(*clone_inputs(inputs)))
    assert first and all(torch.isfinite(t).all() for _, t in first if t.is_floating_point())
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(first, second, strict=True))
    model2, inputs2 = wl.factory("smoke")("cpu", torch.float32)  # seeded: identical weights and inputs
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True)
    )
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(flatten(inputs), flatten(inputs2), strict=True))


class TestImplementations:
    def test_unesco_density_check_values(self) -> None:
        rho = UnescoDensity()
        cases = [((35, 25, 1000), 1062.53817), ((0, 5, 0), 999.96675), ((35, 5, 0), 1027.67547)]
        for (s, t, p), expected in cases:
            args = (torch.tensor([float(v)], dtype=torch.float64) for v in (s, t, p))
            assert rho(*args).item() == pytest.approx(expected, abs=1e-5)

    def test_tridiagonal_solver(self) -> None:
        gen = torch.Generator().manual_seed(0)
        n = 6
        a, c = (
            -torch.rand(2, 3, n, generator=gen, dtype=torch.float64),
            -torch.rand(2, 3, n, generator=gen, dtype=torch.float64),
        )
        b = 3.0 + torch.rand(2, 3, n, generator=gen, dtype=torch.float64)
        d = torch.rand(2, 3, n, generator=gen, dtype=torch.float64)
        x = TurbulentKineticEnergy._thomas(a, b, c, d)
        dense = torch.diag_embed(b) + torch.diag_embed(a[..., 1:], -1) + torch.diag_embed(c[..., :-1], 1)
        assert torch.allclose(dense @ x.unsqueeze(-1), d.unsqueeze(-1), atol=1e-12)

    def test_decode_step_is_idempotent_and_writes_its_slot(self) -> None:
        model, (tokens, position, k_cache, v_cache) = registry.get("llm_decode_static_kv").factory("smoke")(
            "cpu", torch.float32
        )
        assert isinstance(model, DecodeStep)
        before = k_cache.clone()
        with torch.no_grad():
            first = model(tokens, position, k_cache, v_cache)
            written = k_cache.clone()
            second = model(tokens, position, k_cache, v_cache)
        slot = int(position)
        assert not torch.equal(before[:, :, :, slot], written[:, :, :, slot])
        assert torch.equal(before[:, :, :, slot + 1 :], written[:, :, :, slot + 1 :])
        assert torch.equal(first, second) and torch.equal(written, k_cache)


class TestTensors:
    def test_flatten_paths(self) -> None:
        out = {"logits": torch.ones(2), "extra": [torch.zeros(1), None, (torch.ones(1), 3)]}
        assert [p for p, _ in flatten(out)] == ["logits", "extra.0", "extra.2.0", "extra.2.1"]

    def test_variant_inputs_new_storage_new_floats_same_ints(self) -> None:
        x, ids, scalar = torch.arange(6.0).reshape(2, 3), torch.arange(4), torch.tensor(2.0)
        nx, nids, nscalar = variant_inputs((x, ids, scalar))
        assert nx.data_ptr() != x.data_ptr() and not torch.equal(nx, x) and nx.shape == x.shape
        assert nids.data_ptr() != ids.data_ptr() and torch.equal(nids, ids)
        assert nscalar.item() != scalar.item()
        (images,) = variant_inputs(([x, x],))
        assert isinstance(images, list) and images[0].data_ptr() != x.data_ptr()
