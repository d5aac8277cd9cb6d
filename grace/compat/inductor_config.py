"""The config grace compiles Inductor and AOTAutograd with, and what the environment lets it change.

Problem: grace's compiles for training (``grace.compat.torch.compile_with_inductor``) need AOTAutograd's
donated buffers off (a backward that reuses its saved tensors' memory cannot run twice), and with them
Inductor's FX graph cache, whose key leaves out which backward inputs were donated (torch 2.11, 2.13):
a backward another compile cached with donated buffers would come back to grace writing its saved
tensors. Config patches cannot always say so: an option with an ``env_name_force`` variable set in the
environment (``TORCHINDUCTOR_FX_GRAPH_CACHE=1``) keeps the environment's value under any patch.

Design: options are patched only where this torch has them; whether the FX graph cache stays on under a
patch that turns it off is probed each time a patch set is made (a cheap read of the config), and where
it does, every Inductor cache is off for these compiles (``force_disable_caches``, which compiles
Triton's kernels afresh), since no patch reaches the one cache that matters.

Invariant: the patches never leave a donation-free compile able to load a graph another compile cached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def functorch_patched(wanted: bool, **values: Any) -> Iterator[None]:
    """AOTAutograd's config with ``values`` for the options this torch has, when ``wanted``."""
    if not wanted:
        yield
        return
    try:
        import torch._functorch.config as functorch_config
    except Exception:
        yield
        return
    present = {k: v for k, v in values.items() if hasattr(functorch_config, k)}
    with functorch_config.patch(present):
        yield


def inductor_patches(*, donation_off: bool) -> dict[str, Any]:
    """Inductor config for grace's compiles: its CUDA graphs off and, where donated buffers are off, its
    FX graph cache too (``compile_with_inductor``). An environment variable can force that cache on over
    any config patch (``TORCHINDUCTOR_FX_GRAPH_CACHE=1``, torch 2.11, 2.13); then every Inductor cache
    is turned off for these compiles (``force_disable_caches``: Triton's kernels compile afresh)."""
    import torch._inductor.config as inductor_config

    patches: dict[str, Any] = {"triton.cudagraphs": False}
    if donation_off:
        caches = ("fx_graph_cache", "fx_graph_remote_cache")
        patches.update({name: False for name in caches if hasattr(inductor_config, name)})
        if fx_graph_cache_forced_on() and hasattr(inductor_config, "force_disable_caches"):
            patches["force_disable_caches"] = True
    return patches


def fx_graph_cache_forced_on() -> bool:
    """Whether Inductor's FX graph cache stays on under a config patch that turns it off (the
    environment forces it)."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config, "fx_graph_cache"):
        return False
    with inductor_config.patch(fx_graph_cache=False):
        return bool(inductor_config.fx_graph_cache)
