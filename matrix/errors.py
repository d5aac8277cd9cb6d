"""The one user-facing error type of the matrix package.

Problem: the CLI, the nox sessions and the pytest plugin all report the same failures (a malformed
matrix.toml, an unreadable store, an export file from a newer grace-matrix) and each must become one
clear line and a meaningful exit status, never a traceback.

Design: every error a user can fix is a ``MatrixError``; its subclasses only choose the exit status.
The message says what happened, what was expected and how to fix it.

Invariant: the CLI is the only place that turns these into printed lines (``matrix_cli.main``).
"""

from __future__ import annotations


class MatrixError(Exception):
    """A problem the user can fix; exit status 1."""

    exit_code: int = 1


class ConfigError(MatrixError):
    """matrix.toml, a store URL or a command line that cannot be used; exit status 2."""

    exit_code = 2


class StoreError(ConfigError):
    """The store cannot be opened or is not a grace-matrix store (corrupt, newer schema); exit status 2."""


class TransferError(ConfigError):
    """An export file cannot be read (not UTF-8, malformed line, a field of the wrong type, newer format,
    inconsistent rows); the message names the file and line; exit status 2."""
