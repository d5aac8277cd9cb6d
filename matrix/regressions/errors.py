"""The one user-facing error of regression detection: a bad thresholds or expected-status file, or a
run that cannot be found. The CLI turns it into one line and a non-zero exit."""

from __future__ import annotations


class RegressionsError(Exception):
    """What went wrong, what was expected and how to fix it, in one line."""
