"""The user-facing errors of regression detection, as kinds of the matrix package's one error type.

``matrix.cli.main`` turns each into one line and its exit status: 1 for a user error (a run that cannot
be found), 2 for a configuration error (a bad thresholds or expected-status file).
"""

from __future__ import annotations

from matrix.errors import ConfigError, MatrixError


class RegressionsError(MatrixError):
    """What went wrong, what was expected and how to fix it, in one line; exit status 1."""


class RegressionsConfigError(RegressionsError, ConfigError):
    """A thresholds or expected-status file is unreadable, malformed or inconsistent; exit status 2."""

    exit_code = 2
