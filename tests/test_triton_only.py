"""A Triton-only cell never imports torch: its suites run, in an interpreter that cannot import torch,
with every test passing or skipping (issue: the PTX checks imported grace.compat.torch and died on
``No module named 'torch'`` in every Triton-only cell).

The interpreter is made torch-less by ``tests/resources/no_torch/sitecustomize.py`` on PYTHONPATH, which
also reaches the pytest child that ``grace-matrix run`` starts; any future import of torch on these code
paths fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from matrix.cells import CellKind, load_matrix
from matrix.store.db import open_store
from matrix.store.models import PIStageResult, Run
from matrix.store.models import TestOutcome as Outcome

ROOT = Path(__file__).resolve().parent.parent
NO_TORCH = ROOT / "tests" / "resources" / "no_torch"

pytest.importorskip("triton")


def _env() -> dict[str, str]:
    paths = [str(NO_TORCH), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _installed_triton_cell() -> str:
    """The Triton-only cell of matrix.toml for the Triton installed here (same release, any patch)."""
    import triton
    from packaging.version import Version

    installed = Version(triton.__version__)
    for cell in load_matrix(ROOT / "matrix.toml").cells:
        if (
            cell.kind is CellKind.TRITON_ONLY
            and cell.triton
            and cell.triton.release[:2] == installed.release[:2]
        ):
            return cell.id
    pytest.skip(f"matrix.toml has no Triton-only cell for the installed Triton {installed}")


def test_the_blocker_hides_torch() -> None:
    probe = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('torch') is None\n"
        "try:\n    import torch\nexcept ModuleNotFoundError as exc:\n    print('blocked', exc.name)\n"
        "import grace.compat.triton, importlib.metadata\n"
        "assert importlib.metadata.version('triton')\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "blocked torch"


@pytest.mark.slow
def test_triton_only_cell_runs_its_suites_without_torch(tmp_path: Path) -> None:
    cell_id = _installed_triton_cell()
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    argv = [sys.executable, "-m", "matrix_cli", "run", "--cell", cell_id, "--db", url, "-n", "0"]
    argv += ["--label", "no-torch", "--", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=540)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "No module named 'torch'" not in output, output[-4000:]
    Session = open_store(url)
    with Session() as db:
        run = db.scalars(select(Run).where(Run.label == "no-torch")).one()
        outcomes = dict(
            db.execute(
                select(Outcome.outcome, func.count())
                .where(Outcome.run_pk == run.id)
                .group_by(Outcome.outcome)
            ).all()
        )
        stages = db.scalar(
            select(func.count()).select_from(PIStageResult).where(PIStageResult.run_pk == run.id)
        )
    assert run.status == "complete"
    assert outcomes.get("passed", 0) > 0, outcomes
    assert set(outcomes) <= {"passed", "skipped"}, outcomes
    assert stages and stages > 0
