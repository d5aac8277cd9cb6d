"""Make this interpreter (and every child it starts with this directory on PYTHONPATH) one without torch.

Each meta-path finder is wrapped so that it does not know ``torch`` or its submodules: ``import torch``
raises ``ModuleNotFoundError``, ``importlib.util.find_spec("torch")`` returns None and
``importlib.metadata`` finds no torch distribution, as in a Triton-only cell where torch is not
installed. Everything else reaches the wrapped finders unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

BLOCKED = "torch"


class NoTorchFinder:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == BLOCKED or name.startswith(BLOCKED + "."):
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(name, path, target)

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:
        find = getattr(self.inner, "find_distributions", None)
        for dist in find(*args, **kwargs) if find is not None else ():
            if (dist.metadata["Name"] or "").lower() != BLOCKED:
                yield dist

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


for _name in [m for m in sys.modules if m == BLOCKED or m.startswith(BLOCKED + ".")]:
    del sys.modules[_name]
sys.meta_path[:] = [f if isinstance(f, NoTorchFinder) else NoTorchFinder(f) for f in sys.meta_path]
