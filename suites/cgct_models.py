"""Models whose CPU tensors keep Inductor from capturing them whole, shared by the CGCT stage suite and the
CGCT unit tests (one definition, so both check the same code and its hash)."""

from __future__ import annotations

import torch


def position_ids(x: torch.Tensor) -> torch.Tensor:
    """CPU position ids: ``torch.arange`` on the CPU, then moved to the input's device."""
    batch, length = x.shape
    positions = torch.arange(length).unsqueeze(0).expand(batch, -1).to(x.device)
    return x * 2 + positions


class Detector(torch.nn.Module):
    """Detection-style head: an anchors buffer, a plain tensor attribute and a list of grids on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4)
        self.register_buffer("anchors", torch.arange(16.0).reshape(4, 4))
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
        self.grids = [torch.full((4,), 0.5), torch.linspace(0, 1, 4)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(x) + self.anchors.to(x.device)
        y = y * self.scale.to(x.device)
        for grid in self.grids:
            y = y - grid.to(x.device)
        return y
