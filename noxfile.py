"""nox sessions of grace-matrix, derived from matrix.toml.

- ``cell(<id>)``: one session per cell of matrix.toml (``nox -l`` lists them all). A venv or
  triton-only cell builds its virtualenv with the pinned torch and Triton (validated by matrix/cells.py
  before any installer sees them), then runs the cell's suites with the recorder under pytest-xdist
  through ``grace-matrix run``. Arguments after ``--`` go to pytest. A cell whose environment cannot
  be built is recorded in the store as ``install_failed`` and fails alone. The ``current`` cell uses the
  interpreter running nox as it is.
- ``matrix``: selects cells (``-- --tag nightly``, ``-- --cell torch-2.4``; default: the matrix's
  default tag), queues their sessions, then ``dashboard`` and last ``summary --check``, which fails
  (so ``nox -s matrix`` exits non-zero) with one line per broken cell: a result failing against
  expected.toml, a test that failed without recording its result, a run that crashed or hit its deadline;
  it closes with the verdict block (ok or the broken cells, each failing since when, and where to look).
- ``published``: the committed exports (``results/*.jsonl``) in a fresh store, then
  ``docs/COMPATIBILITY.md`` and the dashboard (``site/``) from it.
- ``tests``, ``lint``, ``summary``, ``dashboard``.

Venvs are reused; a cell's install step is skipped when a stamp in its venv shows the same install
commands and the same pyproject.toml. Results go to the store given by ``GRACE_MATRIX_DB``, else
``.grace-matrix/store.sqlite`` here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from matrix.cells import CellKind, CellSpec, Installer, Matrix, load_matrix  # noqa: E402 (stdlib + packaging)
from matrix.errors import ConfigError  # noqa: E402

try:
    MATRIX: Matrix = load_matrix(ROOT / "matrix.toml")
except ConfigError as exc:
    raise SystemExit(f"nox: {exc}") from None

nox.needs_version = ">=2024.4.15"
nox.options.sessions = ["matrix"]
nox.options.reuse_venv = "yes"

LABEL_ENV = "GRACE_MATRIX_LABEL"
STAMP = ".grace-matrix-install.json"
TEST_TORCH, TEST_TRITON = "torch==2.13.0", "triton==3.7.1"
_TAIL_LINES = 60
# Installer output echoed while it runs (pip's and uv's); the rest, resolution steps and index warnings,
# is kept for a failure's message.
_SHOWN = re.compile(
    r"\s*(Downloading|Installing collected|Successfully installed|Installed|Prepared|ERROR|error|fatal)"
)


def _params() -> list[object]:
    # python=False: the current cell runs in nox's own interpreter (no venv); None: a venv of nox's python.
    return [
        nox.param(False if c.kind is CellKind.CURRENT else None, c.id, id=c.id, tags=list(c.tags))
        for c in MATRIX.cells
    ]


@nox.session(reuse_venv=True)
@nox.parametrize("python,cell_id", _params())
def cell(session: nox.Session, cell_id: str) -> None:
    """One cell of matrix.toml: build its environment, run its suites, record them."""
    spec = MATRIX.cell(cell_id)
    if spec.kind is CellKind.CURRENT:
        python = sys.executable
        _require_runtime(session, python)
    else:
        python = _venv_python(session)
        if exclusion := MATRIX.exclusion_for(spec, _python_version(python)):
            session.skip(f"cell {cell_id} cannot run here: {exclusion.reason}")
        failure = _install_cell(session, spec, python)
        if failure is not None:
            _record(session, python, spec, ["--install-failed", failure])
            session.error(f"cell {cell_id}: the environment could not be built; recorded as install_failed")
    workers = os.environ.get("GRACE_MATRIX_WORKERS", "auto")
    _record(session, python, spec, ["-n", workers, "--", *session.posargs])


@nox.session(python=False)
def matrix(session: nox.Session) -> None:
    """Run the selected cells (default: matrix.toml's default tag), then summarize. `-- --tag T --cell ID`."""
    parser = argparse.ArgumentParser(prog="nox -s matrix --")
    parser.add_argument("--tag", action="append", default=[], help="cells with this tag (repeatable)")
    parser.add_argument("--cell", action="append", default=[], help="this cell (repeatable)")
    parser.add_argument("--label", default=None, help="label of the runs (default: matrix-<UTC time>)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then arguments for pytest")
    try:
        args = parser.parse_args(session.posargs)
        selected = MATRIX.select(args.tag, args.cell)
    except ConfigError as exc:
        session.error(str(exc))
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    label = (
        args.label
        or os.environ.get(LABEL_ENV)
        or dt.datetime.now(dt.timezone.utc).strftime("matrix-%Y%m%dT%H%M%SZ")
    )
    os.environ[LABEL_ENV] = label  # read by the queued sessions, which run in this process
    session.log(f"label {label}: {len(selected)} cells: {', '.join(c.id for c in selected)}")
    for spec in selected:
        if (exclusion := MATRIX.exclusion_for(spec)) is not None:
            session.log(f"passing over {spec.id}: {exclusion.reason}")
            continue
        session.notify(f"cell({spec.id})", posargs=pytest_args)
    session.notify("dashboard", posargs=[])  # not the matrix's own arguments
    # Last, after every cell ran: the runs of the label, and a failure with one line per broken cell.
    session.notify("summary", posargs=["--label", label, "--check"])
    session.log(f"queued {len(selected)} cell session(s), then the dashboard and the summary: they run next")


def _install_project(session: nox.Session) -> None:
    """The project itself (editable) in the session's venv, skipped when its stamp is current."""
    if (failure := _ensure_installed(session, _venv_python(session), [["-e", "."]])) is not None:
        session.error(f"could not install the project: {failure.splitlines()[-1]}")


@nox.session(reuse_venv=True)
def summary(session: nox.Session) -> None:
    """Print the runs of the store (after `matrix`: the runs of its label)."""
    _install_project(session)
    session.run("grace-matrix", "summary", *session.posargs)


@nox.session(reuse_venv=True)
def dashboard(session: nox.Session) -> None:
    """Render the static dashboards from the store."""
    _install_project(session)
    session.run("grace-matrix", "dashboard", *session.posargs)


@nox.session(reuse_venv=True)
def published(session: nox.Session) -> None:
    """The committed results (results/*.jsonl) in one fresh store: docs/COMPATIBILITY.md, docs/PAPER.md
    and the site."""
    _install_project(session)
    exports = sorted(str(p) for p in Path("results").glob("*.jsonl"))
    if not exports:
        session.error("no store exports under results/ (results/*.jsonl)")
    path = Path(session.create_tmp()).resolve() / "published.sqlite"
    path.unlink(missing_ok=True)  # the committed exports alone, nothing from an earlier call
    store = f"sqlite:///{path}"
    session.run("grace-matrix", "ingest", "--db", store, *exports)
    session.run("grace-matrix", "compatibility", "--db", store)
    session.run("grace-matrix", "paper-doc", "--db", store)
    session.run("grace-matrix", "dashboard", "--db", store, *session.posargs)


@nox.session(reuse_venv=True)
def tests(session: nox.Session) -> None:
    """The project's tests on CPU (torch 2.13.0, triton 3.7.1), two xdist workers; then the suites'
    smoke tier in the `current` cell, recorded into a throwaway store and summarised."""
    session.install(TEST_TORCH, TEST_TRITON, "-e", ".[test,suites]")
    try:
        session.run("pytest", "tests/", "-n", "2", *session.posargs)
    except nox.command.CommandFailed as exc:
        # Exit code 5 means pytest selected no test: that is a failure of the test command, said plainly.
        if "code 5" in str(exc.reason):
            session.error(
                "pytest collected no tests from tests/ (exit code 5): the selection matched nothing"
            )
        raise
    if session.posargs:
        return  # a selection of tests was asked for, not the whole command
    store = f"sqlite:///{Path(session.create_tmp()).resolve() / 'smoke.sqlite'}"
    # Modes that run on a CPU (the graph modes record why they skip); workloads not started within the
    # budget are recorded as skipped with that reason, so the run stays within minutes.
    session.run("grace-matrix", "run", "--cell", "current", "--label", "smoke", "--db", store, "-n", "2",
                "--", "--modes", "eager,inductor,grace,grace-cpu", "--time-budget-s", "300",
                env={"GRACE_SUITE_TIER": "smoke"})  # fmt: skip
    session.run("grace-matrix", "summary", "--db", store)


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy on the packages [tool.mypy] lists."""
    session.install("-e", ".[lint]", "pytest")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # [tool.mypy] packages


# -- helpers -------------------------------------------------------------------------------------------


def _venv_python(session: nox.Session) -> str:
    bindir = Path(session.bin)
    for name in ("python", "python.exe", "python3"):
        if (bindir / name).exists():
            return str(bindir / name)
    session.error(f"no python in {bindir}")


def _python_version(python: str) -> str:
    if python == sys.executable:
        return platform.python_version()
    out = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _install_commands(spec: CellSpec) -> list[list[str]]:
    """Installer arguments for the cell, in order (module docstring of matrix/cells.py: pins are valid)."""
    index = MATRIX.index_for(spec)
    index_args = list(index.installer_args()) if index else []
    # First the recorder's own light dependencies, so that a failed pin can still be recorded.
    commands = [["-e", ".[cell]"]]
    if spec.kind is CellKind.TRITON_ONLY:
        extras = ",".join(spec.extras)
        return [
            *commands,
            [*index_args, str(spec.triton_requirement), "-e", f".[{extras}]" if extras else "."],
        ]
    project = f".[{','.join(spec.extras)}]" if spec.extras else "."
    # torch pins its own Triton; the last step installs the cell's Triton over it (a no-op unless the
    # cell is a canary), without letting the resolver undo the torch pin.
    return [
        *commands,
        [*index_args, str(spec.torch_requirement), "-e", project],
        [*index_args, "--no-deps", str(spec.triton_requirement)],
    ]


def _install_cell(session: nox.Session, spec: CellSpec, python: str) -> str | None:
    return _ensure_installed(session, python, _install_commands(spec), spec.installer)


def _ensure_installed(
    session: nox.Session, python: str, commands: list[list[str]], installer: Installer = Installer.PIP
) -> str | None:
    """Run the install commands unless the venv's stamp shows them done; the failure's output, or None."""
    stamp = Path(python).parent.parent / STAMP
    key = hashlib.sha256(
        json.dumps([installer.value, commands, (ROOT / "pyproject.toml").read_text()]).encode()
    ).hexdigest()
    if stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        session.log("environment already built (install stamp matches); skipping the install")
        return None
    stamp.unlink(missing_ok=True)
    for command in commands:
        if installer is Installer.UV:
            uv = shutil.which("uv")
            if uv is None:
                return (
                    "installer 'uv' is not on PATH (pip install uv, or set installer = \"pip\" for the cell)"
                )
            argv = [uv, "pip", "install", "--python", python, *command]
        else:
            argv = [python, "-m", "pip", "install", *command]
        code, tail = _stream(session, argv)
        if code != 0:
            return f"{' '.join(argv[argv.index('install') :])} exited with {code}:\n{tail}"
    stamp.write_text(json.dumps({"key": key, "commands": commands}))
    return None


def _stream(session: nox.Session, argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` in the project root, echoing the lines of its output that show progress (``_SHOWN``:
    downloads, what is installed, errors); its exit status and last lines (all of them, for a failure)."""
    session.log(" ".join(argv))
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    with subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if _SHOWN.match(line):
                sys.stdout.write(line)
            tail.append(line.rstrip())
    return proc.returncode, "\n".join(tail)


def _require_runtime(session: nox.Session, python: str) -> None:
    probe = subprocess.run(
        [python, "-c", "import sqlalchemy, alembic, tqdm, pytest"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        session.error(
            f"the current cell runs in nox's own interpreter ({python}), which lacks the recorder's "
            "dependencies; install them there: python -m pip install -e '.[cell]'"
        )


def _record(session: nox.Session, python: str, spec: CellSpec, args: list[str]) -> None:
    """``grace-matrix run`` for the cell, in its interpreter, with the project importable from here."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args[0] != "--install-failed":
        session.run(python, "-m", "matrix_cli", "run", "--cell", spec.id, *args, env=env, external=True)
        return
    message_file = Path(session.create_tmp()) / f"install-failure-{spec.id}.txt"
    message_file.write_text(args[1])
    # The venv may be too broken to record from; nox's own interpreter may have what it takes.
    for interpreter in dict.fromkeys([python, sys.executable]):
        command = [
            interpreter,
            "-m",
            "matrix_cli",
            "run",
            "--cell",
            spec.id,
            "--install-failed",
            f"@{message_file}",
        ]
        try:
            session.run(*command, env=env, external=True)
            return
        except nox.command.CommandFailed:
            continue
    session.log(f"could not record the install failure of {spec.id} in the store (see the output above)")
