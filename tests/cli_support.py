"""Test support for the command line: what a failed command printed on stderr."""

from __future__ import annotations

import pytest


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one non-empty line a failed command printed on stderr (and no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
