"""A machine-wide lock that keeps two performance measurements off the GPU at the same time.

pytest-xdist's ``loadgroup`` puts every performance test in one worker, but only when it is asked for
(``--dist loadgroup``); this lock holds whatever the distribution mode. It is an advisory ``flock`` on
a file in the temporary directory; where ``fcntl`` does not exist (Windows) it does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

LOCK_NAME = "grace-matrix-gpu-performance.lock"


@contextlib.contextmanager
def exclusive_gpu(enabled: bool = True, path: str | None = None) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        enabled = False
    if not enabled:
        yield
        return
    lock_path = path or os.path.join(tempfile.gettempdir(), LOCK_NAME)
    with open(lock_path, "a") as handle:
        t0 = time.monotonic()
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        waited = time.monotonic() - t0
        if waited > 1:
            logger.info("waited %.1f s for another performance measurement to finish", waited)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
