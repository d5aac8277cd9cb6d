"""The user-facing errors of regression detection. The CLI turns each into one line and an exit code:
1 for a user error (a run that cannot be found), 2 for a configuration error (a bad thresholds or
expected-status file)."""

from __future__ import annotations


class RegressionsError(Exception):
    """What went wrong, what was expected and how to fix it, in one line."""

    exit_code = 1


class RegressionsConfigError(RegressionsError):
    """A thresholds or expected-status file is unreadable, malformed or inconsistent."""

    exit_code = 2
