"""Picking positional arguments on a hot path: ``picker(indices)(args)`` is ``tuple(args[i] for i in
indices)``, done in C (``operator.itemgetter``) for two indices or more.

Invariant: the result is always a tuple, also for one index (where ``itemgetter`` would return the item
itself) and for none.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

Picker = Callable[[Sequence[Any]], tuple[Any, ...]]


def picker(indices: Sequence[int]) -> Picker:
    if len(indices) >= 2:
        return cast(Picker, operator.itemgetter(*indices))
    if len(indices) == 1:
        (only,) = indices
        return lambda args: (args[only],)
    return lambda args: ()
