"""The graph rewrites of CGCT, one module each; grace.cgct.pipeline applies them in order.

- ``constants``: constant CPU subgraphs (``torch.tensor(0.5)``, ``torch.arange(8)``, numpy scalars)
  computed once and kept on the GPU; factories with symbolic arguments given ``device=<gpu>``.
- ``inputs``: CPU inputs copied to the GPU by the input adapter instead of inside the graph.
- ``attributes``: CPU module attributes left as they are; the graph reads GPU mirrors of them.
- ``border``: copies at the border of moved work become no-ops (or clones, Note [Aliasing at the
  border]); fake-tensor metadata of every moved node is put on the GPU.

All of them work on a clone of the Dynamo graph (grace.compat.dynamo.clone_graph_module) and find
nodes by name, since names are unique within a graph and survive the clone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def nodes_by_name(gm: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {node.name: node for node in gm.graph.nodes}


def example_fake_mode(example_inputs: list[Any]) -> Any:
    """The fake mode of fake example inputs (tests, export), or None for real inputs."""
    for value in example_inputs:
        mode = getattr(value, "fake_mode", None)
        if mode is not None:
            return mode
    return None


def materialize(value: torch.Tensor, device: torch.device, fake_mode: Any) -> torch.Tensor:
    """``value`` on ``device``: a real copy, or a fake one when the graph is traced with fakes."""
    if fake_mode is None:
        return value.to(device)
    with fake_mode:
        return fake_mode.from_tensor(value).to(device)
