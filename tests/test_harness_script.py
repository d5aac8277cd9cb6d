"""scripts/gpu/harness.py: each (model, mode, backend) runs the harness once in its own process, offline,
under its own time limit, and its CSV row lands in harness.json; against a stand-in for PyTorch's harness."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from scripts_support import run_script

# A stand-in for benchmarks/dynamo/huggingface.py: the arguments the real one takes, one CSV row appended
# per run, as the real one writes it; "Sleepy" outlives any limit.
FAKE_SUITE = """
import argparse, csv, os, time
parser = argparse.ArgumentParser()
for name in ("--only", "--backend", "--output", "--device", "--batch-size"):
    parser.add_argument(name)
args, rest = parser.parse_known_args()
if args.only == "Sleepy":
    time.sleep(60)
accuracy = "pass" if os.environ.get("HF_HUB_OFFLINE") == "1" else "offline_not_set"
if "--training" in rest and "--amp" not in rest:
    accuracy = "no_amp"
new = not os.path.exists(args.output)
with open(args.output, "a", newline="") as handle:
    writer = csv.writer(handle)
    if new:
        writer.writerow(["dev", "name", "batch_size", "accuracy"])
    writer.writerow([args.device, args.only, args.batch_size, f"{accuracy}:{args.backend}"])
"""

HUB_IDS = (
    "distilgpt2",
    "t5-small",
    "google/fnet-base",
    "YituTech/conv-bert-base",
    "allenai/longformer-base-4096",
)


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    folder = tmp_path / "harness"
    folder.mkdir()
    (folder / "common.py").write_text("")
    (folder / "huggingface.py").write_text(FAKE_SUITE)
    return folder


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache that already holds every config the harness reads at import (nothing to seed)."""
    cache = tmp_path / "hub"
    for repo_id in HUB_IDS:
        refs = cache / f"models--{repo_id.replace('/', '--')}" / "refs"
        refs.mkdir(parents=True)
        (refs / "main").write_text("1" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_every_model_mode_and_backend_runs_once_offline(harness, hub_cache, tmp_path) -> None:
    out = tmp_path / "out"
    result = run_script(
        "gpu/harness.py",
        *("--out", str(out), "--harness-dir", str(harness), "--device", "cpu"),
        *("--model", "huggingface:DistillGPT2", "--model", "MobileBertForMaskedLM"),
        *("--", "--batch-size", "2"),
        cwd=tmp_path,
    )
    summary = json.loads((out / "harness.json").read_text())
    runs = [(r["model"], r["mode"], r["backend"], r["row"]["accuracy"]) for r in summary["runs"]]
    assert runs == [
        (model, mode, backend, f"pass:{backend}")
        for model in ("DistillGPT2", "MobileBertForMaskedLM")
        for mode in ("inference", "training")
        for backend in ("grace", "inductor")
    ]
    assert summary["seeded_configs"] == []
    assert {r["row"]["batch_size"] for r in summary["runs"]} == {"2"}
    assert sorted(p.name for p in out.glob("*.csv")) == [
        "grace_huggingface_inference.csv",
        "grace_huggingface_training.csv",
        "inductor_huggingface_inference.csv",
        "inductor_huggingface_training.csv",
    ]
    assert len(list((out / "logs").iterdir())) == 8
    assert "DistillGPT2 training inductor: pass:inductor" in result.stdout


def test_a_run_past_its_limit_is_killed_and_the_next_still_runs(harness, hub_cache, tmp_path) -> None:
    out = tmp_path / "out"
    run_script(
        "gpu/harness.py",
        *("--out", str(out), "--harness-dir", str(harness), "--device", "cpu", "--limit-s", "3"),
        *("--model", "Sleepy", "--model", "DistillGPT2", "--mode", "inference", "--backend", "grace"),
        cwd=tmp_path,
    )
    first, second = json.loads((out / "harness.json").read_text())["runs"]
    assert (first["timed_out"], first["row"]) == (True, None)
    assert (second["timed_out"], second["row"]["accuracy"]) == (False, "pass:grace")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nosuite:Bert"], "expected SUITE:NAME"),
        (["--harness-dir", "/nonexistent"], "set GRACE_HARNESS_DIR"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(harness, tmp_path, args, message) -> None:
    base = ["--out", str(tmp_path / "out"), "--harness-dir", str(harness)]
    result = run_script("gpu/harness.py", *base, *args, cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_seeded_configs_load_offline_through_auto_config(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
    try:
        import harness as script
    finally:
        sys.path.pop(0)
    cache = tmp_path / "hub"
    assert sorted(script.seed_hub_cache(cache)) == sorted(HUB_IDS)
    assert script.seed_hub_cache(cache) == []
    config = transformers.AutoConfig.from_pretrained(
        "distilgpt2", cache_dir=os.fspath(cache), local_files_only=True
    )
    assert (config.model_type, config.n_layer) == ("gpt2", 6)


def test_a_source_tree_gets_the_backends_entry_points_the_package_declares(tmp_path, monkeypatch) -> None:
    """Without an installed package the harness cannot find ``--backend grace``: the runs get a folder
    whose metadata declares pyproject.toml's dynamo backends."""
    import importlib.metadata

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
    try:
        import harness as script
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(script.importlib.metadata, "entry_points", lambda group: [])
    folder = script.backend_entry_points(tmp_path)
    assert folder is not None
    (found,) = importlib.metadata.distributions(path=[folder])
    declared = [(ep.name, ep.value) for ep in found.entry_points if ep.group == "torch_dynamo_backends"]
    assert declared == [("grace", "grace.backend:grace_backend")]
    monkeypatch.undo()  # installed (this test's environment): nothing to add
    assert script.backend_entry_points(tmp_path / "again") is None
