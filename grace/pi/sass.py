"""Reading SASS (cuobjdump -sass output) for the checks that a rewritten kernel does what PI needs.

The rewrite adds one 64-bit global load per ``ld.param`` of a rewritten pointer. On sm_90 those are
``LDG.E.64`` instructions (possibly with cache or eviction suffixes). Counting them in the original
and the rewritten cubin shows that ptxas kept the extra loads: it must not have folded them away.
"""

from __future__ import annotations

import re

_LDG_64 = re.compile(r"\bLDG(?:\.[A-Z0-9_]+)*\.64\b")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)


def count_64bit_global_loads(sass: str) -> int:
    """Number of 64-bit global load instructions (``LDG...64``) in SASS text."""
    return sum(1 for line in sass.splitlines() if _LDG_64.search(line))


def functions(sass: str) -> list[str]:
    """Names of the functions a SASS listing contains."""
    return _FUNCTION.findall(sass)
