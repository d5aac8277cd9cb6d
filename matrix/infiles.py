"""Text files the commands read (matrix.toml, thresholds, expected statuses, the paper's figures, the
runner labels, a workflow to compare, a message file): read with a size bound.

Problem: a path given on the command line may name something that never ends (``/dev/zero``, a pipe
left open) or a huge file by mistake; ``Path.read_text`` would read it whole and the process would be
killed for memory instead of saying what is wrong.

Design: ``read_text`` reads at most ``MAX_TEXT_BYTES`` plus one byte in binary, then decodes as UTF-8
(a ``UnicodeDecodeError`` reaches the caller as before, with the byte where it failed). A file past the
bound is an ``OSError`` whose ``strerror`` says so, which every caller already turns into its own
one-line error ("cannot read ...: <strerror>").

Invariant: nothing here reads more than ``MAX_TEXT_BYTES + 1`` bytes of any file.
"""

from __future__ import annotations

import errno
from pathlib import Path

MAX_TEXT_BYTES = 16 << 20  # these files are kilobytes; a bound far past any of them


def read_text(path: Path, errors: str = "strict") -> str:
    """The whole of ``path`` as UTF-8 text (``errors`` as ``bytes.decode`` takes it); ``OSError`` (EFBIG)
    when it holds more than the bound."""
    with path.open("rb") as handle:
        data = handle.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise OSError(errno.EFBIG, f"more than {MAX_TEXT_BYTES} bytes; not a file of this kind", str(path))
    return data.decode("utf-8", errors)
