"""PyTorch's own dynamo benchmark harness (``benchmarks/dynamo``) with ``--backend grace`` and a baseline.

The harness is PyTorch's code, never this project's: a copy of its ``benchmarks/dynamo`` folder for the
installed torch is carried beside the tree (``$GRACE_HARNESS_DIR``, default
``.carry/harness/torch-<major.minor>``). Every (model, mode, backend) runs as its own harness process
under its own time limit, so one hang or crash costs one row; the harness appends its rows to one CSV per
(backend, suite, mode) under ``--out`` and each run's output goes to ``logs/``.

The harness finds ``--backend grace`` through the package's entry point (``torch_dynamo_backends``). A
source tree that was never installed has none, so the runs then get one: a ``.dist-info`` folder under
``--out`` holding the entry points pyproject.toml declares, put on their ``PYTHONPATH``.

No network: the Hugging Face runner builds its models from config classes, but a few of them
(``EXTRA_MODELS``: DistillGPT2, T5Small, GoogleFnet, YituTechConvBert, AllenaiLongformerBase) read a
hub config when the module is imported, so every Hugging Face run fails at import without a cache. The
runs get a private hub cache under ``--out`` seeded with those configs, built from the transformers
config classes with the hub configs' sizes, and run offline; weights are never downloaded (the
``HF_LLM_MODELS``, which need them, cannot run here).

Run from the repository root: ``python scripts/gpu/harness.py --out DIR [--model SUITE:NAME ...]
[--mode inference|training|... ...] [--backend NAME ...] [-- extra harness arguments]``. Writes
``harness.json`` (one record per run: command, exit code, seconds, the CSV row) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SUITES = ("huggingface", "timm_models", "torchbench")
MODES: dict[str, tuple[str, ...]] = {
    "inference": ("--accuracy", "--inference"),
    "training": ("--accuracy", "--training", "--amp"),
    "training-float32": ("--accuracy", "--training", "--float32"),  # --amp excludes --float32 (CPU runs)
    "inference-perf": ("--performance", "--inference"),
    "training-perf": ("--performance", "--training", "--amp"),
}
DEFAULT_MODELS = ("huggingface:DistillGPT2", "huggingface:MobileBertForMaskedLM")
DEFAULT_MODES = ("inference", "training")
DEFAULT_BACKENDS = ("grace", "inductor")

# Hub configs read by huggingface.py's EXTRA_MODELS at import: (transformers config class, the fields in
# which the hub config differs from the class's defaults).
HUB_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "distilgpt2": ("GPT2Config", {"n_layer": 6}),
    "t5-small": ("T5Config", {}),
    "google/fnet-base": ("FNetConfig", {}),
    "YituTech/conv-bert-base": ("ConvBertConfig", {}),
    "allenai/longformer-base-4096": (
        "LongformerConfig",
        {
            "vocab_size": 50265,
            "max_position_embeddings": 4098,
            "type_vocab_size": 1,
            "layer_norm_eps": 1e-5,
            "attention_window": 512,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "sep_token_id": 2,
        },
    ),
}
SEEDED_REVISION = "0" * 40


@dataclass(frozen=True)
class Run:
    suite: str
    model: str
    mode: str
    backend: str

    @property
    def csv_name(self) -> str:
        return f"{self.backend}_{self.suite}_{self.mode}.csv"

    @property
    def log_name(self) -> str:
        safe = self.model.replace("/", "--")
        return f"{self.suite}_{safe}_{self.mode}_{self.backend}.log"


def parse_model(text: str) -> tuple[str, str]:
    """``SUITE:NAME`` (or a bare ``NAME``, a Hugging Face model) -> (suite, name)."""
    suite, sep, name = text.partition(":")
    if not sep:
        suite, name = "huggingface", text
    if suite not in SUITES or not name:
        raise ValueError(f"model {text!r}: expected SUITE:NAME with SUITE one of {', '.join(SUITES)}")
    return suite, name


def plan(models: list[str], modes: list[str], backends: list[str]) -> list[Run]:
    """The runs in order: per model and mode, every backend one after the other (a pair stays close)."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    return [
        Run(suite, name, mode, backend)
        for suite, name in map(parse_model, models)
        for mode in modes
        for backend in backends
    ]


def command(run: Run, harness: Path, out: Path, device: str, extra: list[str]) -> list[str]:
    """The harness command line of one run; ``extra`` comes last so it can override nothing silently."""
    return [
        sys.executable,
        str(harness / f"{run.suite}.py"),
        *MODES[run.mode],
        "--backend",
        run.backend,
        "--device",
        device,
        "--only",
        run.model,
        "--output",
        str(out / run.csv_name),
        *extra,
    ]


def default_harness_dir() -> Path:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return REPO / ".carry" / "harness" / f"torch-{major}.{minor}"


def seed_hub_cache(cache: Path) -> list[str]:
    """Write a config for every hub id of ``HUB_CONFIGS`` missing from ``cache`` (the hub's own layout)."""
    import transformers

    seeded = []
    for repo_id, (class_name, fields) in HUB_CONFIGS.items():
        folder = cache / f"models--{repo_id.replace('/', '--')}"
        if (folder / "refs" / "main").exists():
            continue
        config = getattr(transformers, class_name)(**fields)
        snapshot = folder / "snapshots" / SEEDED_REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(config.to_json_string())
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(SEEDED_REVISION)
        seeded.append(repo_id)
    return seeded


def csv_row(path: Path, model: str) -> dict[str, str] | None:
    """The last row the harness wrote for ``model`` in ``path``, by its own header."""
    if not path.exists():
        return None
    with path.open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("name") == model]
    return rows[-1] if rows else None


def run_one(run: Run, argv: list[str], out: Path, env: dict[str, str], limit_s: float) -> dict[str, Any]:
    """One harness process in its own process group, killed with its children past ``limit_s``."""
    log = out / "logs" / run.log_name
    started = time.monotonic()
    with log.open("w") as handle:
        handle.write(" ".join(argv) + "\n")
        handle.flush()
        proc = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:  # the step's own time limit (SIGINT): its own session would outlive us
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        if code is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    row = csv_row(out / run.csv_name, run.model)
    return {
        **asdict(run),
        "command": argv,
        "exit_code": code,
        "timed_out": code is None,
        "seconds": round(time.monotonic() - started, 1),
        "row": row,
        "log": str(log.relative_to(out)),
    }


def backend_entry_points(out: Path) -> str | None:
    """A folder to put on the runs' path that declares this tree's dynamo backends as the installed
    package does (pyproject.toml's ``torch_dynamo_backends``), or None where they are installed."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    backends: dict[str, str] = declared["torch_dynamo_backends"]
    found = {ep.name for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    if set(backends) <= found:
        return None
    folder = out / "entry-points"
    info = folder / "grace_matrix-0+source.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grace-matrix\nVersion: 0+source\n")
    lines = "".join(f"{name} = {target}\n" for name, target in backends.items())
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\n{lines}")
    return str(folder)


def outcome(record: dict[str, Any]) -> str:
    """One word per run: the harness's accuracy status or speedup, else why there is none."""
    if record["timed_out"]:
        return "timeout"
    row = record["row"] or {}
    if "accuracy" in row:
        return str(row["accuracy"])
    if "speedup" in row:
        return f"speedup={row['speedup']}"
    return f"no_row(exit={record['exit_code']})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--harness-dir", type=Path, default=os.environ.get("GRACE_HARNESS_DIR"))
    parser.add_argument("--model", action="append", help="SUITE:NAME, repeated")
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="repeated")
    parser.add_argument("--backend", action="append", help="repeated")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit-s", type=float, default=900.0, help="time limit of one run")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no run after this many s")
    parser.add_argument("extra", nargs="*", help="after --: arguments added to every harness run")
    args = parser.parse_args()
    try:
        runs = plan(
            args.model or list(DEFAULT_MODELS),
            args.mode or list(DEFAULT_MODES),
            args.backend or list(DEFAULT_BACKENDS),
        )
    except ValueError as error:
        print(f"harness.py: {error}", file=sys.stderr)
        return 2
    harness = (args.harness_dir or default_harness_dir()).resolve()
    if not (harness / "common.py").exists():
        print(f"harness.py: no benchmarks/dynamo copy at {harness}; set GRACE_HARNESS_DIR", file=sys.stderr)
        return 2
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.setdefault("HF_HUB_CACHE", str(out / "hf-hub"))
    entry_points = backend_entry_points(out)
    if entry_points is not None:  # a source tree: the backends' entry points, and the tree itself
        env["PYTHONPATH"] = os.pathsep.join(p for p in (entry_points, str(REPO), env.get("PYTHONPATH")) if p)
    seeded = seed_hub_cache(Path(env["HF_HUB_CACHE"]))
    print(f"harness {harness}; hub cache {env['HF_HUB_CACHE']} (seeded: {', '.join(seeded) or 'none'})")
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    for run in runs:
        if args.deadline_s is not None and time.monotonic() - started > args.deadline_s:
            records.append({**asdict(run), "skipped": "deadline"})
            print(f"{run.suite} {run.model} {run.mode} {run.backend}: skipped (deadline)")
            continue
        argv = command(run, harness, out, args.device, args.extra)
        record = run_one(run, argv, out, env, args.limit_s)
        records.append(record)
        print(f"{run.suite} {run.model} {run.mode} {run.backend}: {outcome(record)} ({record['seconds']} s)")
        summary = {"harness": str(harness), "seeded_configs": seeded, "runs": records}
        (out / "harness.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
