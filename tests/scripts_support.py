"""Test support: run one of the project's scripts in a child interpreter, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(name: str, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python scripts/<name> args...`` with the checkout on the path; output captured as text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        check=check,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
