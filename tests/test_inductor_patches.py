"""grace.compat.torch.compile_with_inductor: the Inductor config grace compiles with.

A backward compiled by another mode with donated buffers lands in Inductor's FX graph cache under a key
that leaves the donation out; grace, which compiles with donated buffers off, must not get it back (on
the H200 such a backward wrote MT5's saved tensors behind grace's checks). So the FX graph cache is off
exactly where donated buffers are, also where the environment forces that cache on (run_suites.sh sets
``TORCHINDUCTOR_FX_GRAPH_CACHE=1``, which overrides a config patch): there every cache is off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grace.compat import torch as torch_compat


def _compile_patches(
    monkeypatch: pytest.MonkeyPatch, on_graph: Any, keep_donated: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx_module

    seen: dict[str, Any] = {}

    def fake_compile_fx(gm: Any, inputs: Any, inner_compile: Any, config_patches: Any) -> Any:
        seen["patches"] = dict(config_patches)
        seen["donated_buffer"] = functorch_config.donated_buffer
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    record = torch_compat.InnerCompileRecord()
    torch_compat.compile_with_inductor(
        gm, [torch.ones(2)], record, need_inner_outputs=True, on_graph=on_graph, keep_donated=keep_donated
    )
    return seen["patches"], seen


def test_with_donated_buffers_off_the_fx_graph_cache_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    patches, seen = _compile_patches(monkeypatch, on_graph=lambda *args: None)
    assert seen["donated_buffer"] is False
    assert patches["fx_graph_cache"] is False and patches["triton.cudagraphs"] is False


def test_without_an_inner_graph_hook_the_fx_graph_cache_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    patches, _ = _compile_patches(monkeypatch, on_graph=None)
    assert "fx_graph_cache" not in patches and patches["triton.cudagraphs"] is False


# Run in a fresh process: Inductor reads TORCHINDUCTOR_FX_GRAPH_CACHE when its config module loads.
_TRAIN_TWICE = """
import json, torch, torch._dynamo
from torch._dynamo.utils import counters
from grace.compat import inductor_config
from grace.compat import torch as torch_compat

def train_twice(backend):
    torch._dynamo.reset(); counters.clear(); torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        compiled(torch.randn(4, 16)).sum().backward()
    return {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}

def graces(gm, inputs):
    record = torch_compat.InnerCompileRecord()
    return torch_compat.compile_with_inductor(
        gm, inputs, record, need_inner_outputs=False, on_graph=lambda *args: None
    )

print(json.dumps({
    "forced": inductor_config.fx_graph_cache_forced_on(),
    "patches": inductor_config.inductor_patches(donation_off=True),
    "inductor": train_twice("inductor"),
    "grace": train_twice(graces),
}))
"""


def _train_twice_in_a_process(tmp_path: Path, forced: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    if forced:
        env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    command = [sys.executable, "-c", _TRAIN_TWICE]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_backward_cached_with_donated_buffers_does_not_reach_graces_compile(tmp_path: Path) -> None:
    """Mode inductor's backward (donated buffers on) is cached first; grace's compile of the same model,
    with the FX graph cache forced on by the environment, must compile its own, not load that one."""
    found = _train_twice_in_a_process(tmp_path, forced=True)
    assert found["forced"] is True and found["patches"]["force_disable_caches"] is True
    assert found["inductor"] == {"fxgraph_cache_miss": 2}  # forward and backward went into the cache
    assert found["grace"].get("fxgraph_cache_hit", 0) == 0, found


def test_without_the_environment_every_cache_but_the_fx_graph_cache_stays(tmp_path: Path) -> None:
    found = _train_twice_in_a_process(tmp_path, forced=False)
    assert found["forced"] is False and "force_disable_caches" not in found["patches"]
    assert found["grace"].get("fxgraph_cache_hit", 0) == 0, found


def test_option_donated_buffers_keeps_donation_and_the_fx_graph_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``keep_donated`` (option ``donated_buffers``) a training compile keeps AOTAutograd's donated
    buffers, and the FX graph cache needs no turning off: a backward cached without donation writes less
    than grace counts."""
    import torch._functorch.config as functorch_config

    with functorch_config.patch(donated_buffer=True):  # (monkeypatch would delete the config entry)
        patches, seen = _compile_patches(monkeypatch, on_graph=lambda *args: None, keep_donated=True)
    assert seen["donated_buffer"] is True
    assert "fx_graph_cache" not in patches and patches["triton.cudagraphs"] is False
