"""The user-facing errors of regression detection, as kinds of the matrix package's one error type.

``matrix_cli.main`` turns each into one line and its exit status: 1 for a user error (a run that cannot
be found), 2 for a configuration error (a bad thresholds or expected-status file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from matrix.errors import ConfigError, MatrixError
from matrix.infiles import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class RegressionsError(MatrixError):
    """What went wrong, what was expected and how to fix it, in one line; exit status 1."""


class RegressionsConfigError(RegressionsError, ConfigError):
    """A thresholds or expected-status file is unreadable, malformed or inconsistent; exit status 2."""

    exit_code = 2


def read_config_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML table of a thresholds or expected-status file; RegressionsConfigError names ``what``."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise RegressionsConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegressionsConfigError(f"{path}: not valid TOML: {exc}") from exc


def check_format(fmt: object, current: int, source: str) -> None:
    """Refuse a file's ``format`` that is no version (a boolean, which Python takes for 1, zero, text, a
    float) or a version newer than ``current``, the one this reader reads."""
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:
        raise RegressionsConfigError(
            f"{source}: format {json.dumps(fmt, default=str)} is not a format version; expected {current}"
        )
    if fmt > current:
        raise RegressionsConfigError(
            f"{source}: format {fmt} is newer than this reader ({current}); upgrade grace-matrix"
        )
