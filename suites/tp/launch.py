"""One TP run launched from a test: ``torchrun ... -m suites.tp.run`` as a subprocess, its JSON read back.

Problem: a TP workload runs as one process per rank, so a pytest test cannot run it in its own process;
it must launch torchrun, wait a bounded time, and read the results file the run writes
(suites/tp/results.py). The launch can fail before any mode runs: no gloo or NCCL in this torch build, a
rank that dies, a collective that hangs, a file that is missing or unreadable. Each such failure must come
back as a reason that names it (the tail of what torchrun printed), without the machine's paths.

Design: ``TPLaunch`` (frozen) says what to run; ``command`` and ``environment`` derive the argv and the
environment from it; ``launch`` runs the command in a session of its own, its output in log files beside
the results; on timeout it sends that session SIGTERM (torchrun then ends its ranks, which it starts in
sessions of their own) and SIGKILL after a grace period, quoting what the run printed before; otherwise
it reads the results file through ``read_results``. It returns a ``LaunchOutcome``: the results (every
string in them redacted) when the run wrote a readable file for this workload and TP size, and a
``problem`` when the launch itself went wrong. The launcher module and the entry module are fields, so
tests can exercise the failure path with a module that does not exist.

Invariants:
- NVLink multicast stays off in every launched environment (as scripts/gpu/tp_check.sh keeps it: on the
  lent machines it can put shared GPUs out of service), whatever the caller's environment says.
- No text that leaves this module names the out folder, the temporary directory, the checkout or the
  interpreter's prefix: they become ``<out>``, ``<tmp>``, ``<repo>`` and ``<env>`` (suites.redact does
  the replacing, as it does for the recorder through matrix.redact).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suites.redact import ordered_roots, redact_text, redact_tree
from suites.tp.results import TPResultsError, read_results, result_path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the ``suites`` package
LAUNCHER = "torch.distributed.run"
ENTRY = "suites.tp.run"
TAIL_LINES = 25
TAIL_CHARS = 3000
RANK_LOGS = "ranks"  # torchrun's --log-dir under the out folder: each rank's own stdout and stderr
# torchrun's summary of the first rank that failed: its rank, exit code and, for a signal, the signal's name.
ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\).*?"
    r"exitcode\s*:\s*(?P<code>-?\d+)[^\n]*?(?:\((?P<signal>SIG[A-Z]+)\))?\s*$",
    re.DOTALL | re.MULTILINE,
)
KILL_GRACE_S = 45.0  # torchrun gives its ranks 30 s to exit after a SIGTERM
# Forced into every launched environment (see the module invariants and scripts/gpu/tp_check.sh).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TPLaunch:
    """One torchrun: every mode of one TP workload at one TP size."""

    workload: str
    world_size: int
    device: str  # "cpu" (gloo) or "cuda" (NCCL)
    tier: str
    modes: tuple[str, ...]
    samples: int  # timed calls per mode; the run times on CUDA only
    out: Path
    timeout_s: float
    launcher: str = LAUNCHER
    entry: str = ENTRY

    @property
    def results_file(self) -> Path:
        return result_path(self.out, self.workload, self.world_size, self.device)

    @property
    def group_timeout_s(self) -> float:
        """The process group's timeout: a hung collective ends the run before the launch times out."""
        return max(30.0, self.timeout_s - 30.0)

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", self.launcher, *self.launcher_arguments(), "-m", self.entry,
            "--workload", self.workload, "--modes", ",".join(self.modes),
            "--device", self.device, "--tier", self.tier, "--samples", str(self.samples),
            "--timeout-s", f"{self.group_timeout_s:g}", "--out", str(self.out),
        ]  # fmt: skip

    def launcher_arguments(self) -> list[str]:
        """torchrun's own options: each rank's output teed into ``rank_logs`` (and still to the console)."""
        return [
            "--standalone", "--nproc-per-node", str(self.world_size),
            "--log-dir", str(self.rank_logs), "--tee", "3",
        ]  # fmt: skip

    @property
    def rank_logs(self) -> Path:
        return self.out / RANK_LOGS

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank that aborts prints its threads' Python stacks
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed collective ends the run
        if self.device != "cuda":  # two ranks on a small CPU machine: one thread each
            env.setdefault("OMP_NUM_THREADS", "1")
            env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        env.update(NO_MULTICAST)
        return env


@dataclass(frozen=True)
class LaunchOutcome:
    """What one launch gave: the results (redacted) and/or why the launch itself failed."""

    data: dict[str, Any] | None
    problem: str | None
    returncode: int | None  # None: no process ran, or it was ended on timeout
    duration_s: float
    command: str  # redacted
    details: dict[str, Any] = field(default_factory=dict)


class Redactor:
    """The launch's roots (suites.redact) applied to text and to results (mapping keys included)."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = ordered_roots(roots)

    @classmethod
    def for_launch(cls, spec: TPLaunch) -> Redactor:
        roots = {tempfile.gettempdir(): "<tmp>", str(PACKAGE_ROOT): "<repo>", sys.prefix: "<env>"}
        roots[str(spec.out)] = "<out>"
        roots[str(Path(spec.out).resolve())] = "<out>"
        return cls(roots)

    def text(self, text: str) -> str:
        return redact_text(text, self.roots)

    def value(self, value: Any) -> Any:
        """``text`` applied to every string inside dicts and lists (keys included)."""
        return redact_tree(value, self.roots, keys=True)


def backend_problem(device: str) -> str | None:
    """Why this torch cannot run a TP group on ``device`` (gloo on a CPU, NCCL on CUDA), or None."""
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if device == "cuda" and not dist.is_nccl_available():
        return "NCCL is not available in this torch build: TP on CUDA needs it"
    if device != "cuda" and not dist.is_gloo_available():
        return "gloo is not available in this torch build: TP on the CPU needs it"
    return None


def tail(stdout: str, stderr: str) -> str:
    """The last lines of what the run printed (stderr, where torchrun and the ranks report failures)."""
    text = stderr if stderr.strip() else stdout
    lines = [line for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    joined = "\n".join(lines)
    return joined if len(joined) <= TAIL_CHARS else "..." + joined[-TAIL_CHARS:]


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End torchrun: SIGTERM to its session (torchrun ends the ranks, which it starts in sessions of their
    own), then SIGKILL if it has not exited after ``KILL_GRACE_S``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            if hasattr(os, "killpg"):
                os.killpg(proc.pid, sig)
            else:  # pragma: no cover - Windows
                proc.kill()
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _printed(logs: tuple[Path, Path]) -> str:
    stdout, stderr = (path.read_text(errors="replace") if path.exists() else "" for path in logs)
    return tail(stdout, stderr)


def rank_failure(printed: str, rank_logs: Path) -> str | None:
    """The first failed rank in its own words: torchrun's summary names the rank, its exit code and
    signal, and the last lines of that rank's stderr (from ``rank_logs``) say why. torchrun's own
    traceback, which fills the end of what it prints, says nothing about the rank. None when torchrun
    names no failed rank (it failed itself, before or without starting ranks)."""
    found = ROOT_CAUSE.search(printed)
    if found is None:
        return None
    how = f"exit code {found['code']}" + (f", {found['signal']}" if found["signal"] else "")
    logs = sorted(rank_logs.glob(f"*/attempt_*/{found['local']}/stderr.log"), key=lambda p: p.stat().st_mtime)
    said = tail("", logs[-1].read_text(errors="replace")) if logs else ""
    head = f"rank {found['rank']} failed first ({how})"
    return f"{head}; its last lines:\n{said}" if said.strip() else f"{head}; it printed nothing to stderr"


def _why(logs: tuple[Path, Path], rank_logs: Path) -> str:
    """What to quote for a run that exited non-zero: the failed rank's words, else torchrun's tail."""
    stdout, stderr = (path.read_text(errors="replace") if path.exists() else "" for path in logs)
    return rank_failure(stderr + "\n" + stdout, rank_logs) or tail(stdout, stderr)


def launch(spec: TPLaunch) -> LaunchOutcome:
    """Run ``spec`` and read its results; never raises for a failed run (see ``LaunchOutcome``).

    What the run prints goes to ``torchrun.stdout.log`` and ``torchrun.stderr.log`` in the out folder; on
    a timeout the reason quotes what it had printed before it was ended (not the traces of its ending).
    """
    redactor = Redactor.for_launch(spec)
    command = redactor.text(" ".join(spec.command()))
    if spec.launcher == LAUNCHER and (why := backend_problem(spec.device)) is not None:
        return LaunchOutcome(None, why, None, 0.0, command)
    spec.out.mkdir(parents=True, exist_ok=True)
    logs = (spec.out / "torchrun.stdout.log", spec.out / "torchrun.stderr.log")
    t0 = time.monotonic()
    with logs[0].open("wb") as stdout, logs[1].open("wb") as stderr:
        proc = subprocess.Popen(
            spec.command(),
            cwd=PACKAGE_ROOT,
            env=spec.environment(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            returncode: int | None = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
            before = _printed(logs)
            _end(proc)
    duration = time.monotonic() - t0
    details: dict[str, Any] = {"launch_s": round(duration, 3), "exit_status": returncode}
    if returncode is None:
        problem = f"timed out after {spec.timeout_s:g} s (--tp-timeout-s); torchrun and its ranks were ended"
        output = redactor.text(before)
        return LaunchOutcome(
            None, f"{problem}: {output}" if output else problem, None, duration, command, details
        )
    output = redactor.text(_why(logs, spec.rank_logs) if returncode else _printed(logs))
    data, unreadable = _read(spec, redactor)
    if data is None:
        what = f"{spec.launcher} exited {returncode}" if returncode else unreadable
        return LaunchOutcome(
            None, f"{what}: {output}" if output else what, returncode, duration, command, details
        )
    late = f"{spec.launcher} exited {returncode} after writing its results: {output}" if returncode else None
    return LaunchOutcome(data, late, returncode, duration, command, details)


def _read(spec: TPLaunch, redactor: Redactor) -> tuple[dict[str, Any] | None, str]:
    """(the redacted results of this workload and TP size, or None; why they could not be read)."""
    path = spec.results_file
    if not path.exists():
        return None, redactor.text(f"the run wrote no results file {path}")
    try:
        data = read_results(path)
    except TPResultsError as exc:
        return None, redactor.text(str(exc))
    found = (data.get("workload", {}).get("name"), data.get("world_size"))
    if found != (spec.workload, spec.world_size):
        return None, redactor.text(f"{path} holds {found}, not ({spec.workload!r}, {spec.world_size})")
    return redactor.value(data), ""
