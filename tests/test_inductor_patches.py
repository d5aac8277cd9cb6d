"""grace.compat.torch.compile_with_inductor: the Inductor config grace compiles with.

A backward compiled by another mode with donated buffers lands in Inductor's FX graph cache under a key
that leaves the donation out; grace, which compiles with donated buffers off, must not get it back (on
the H200 such a backward wrote MT5's saved tensors behind grace's checks). So the FX graph cache is off
exactly where donated buffers are.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grace.compat import torch as torch_compat


def _compile_patches(monkeypatch: pytest.MonkeyPatch, on_graph: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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
        gm, [torch.ones(2)], record, need_inner_outputs=True, on_graph=on_graph
    )
    return seen["patches"], seen


def test_with_donated_buffers_off_the_fx_graph_cache_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    patches, seen = _compile_patches(monkeypatch, on_graph=lambda *args: None)
    assert seen["donated_buffer"] is False
    assert patches["fx_graph_cache"] is False and patches["triton.cudagraphs"] is False


def test_without_an_inner_graph_hook_the_fx_graph_cache_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    patches, _ = _compile_patches(monkeypatch, on_graph=None)
    assert "fx_graph_cache" not in patches and patches["triton.cudagraphs"] is False
