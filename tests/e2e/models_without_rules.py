"""A model with an op DTensor has no sharding rule for (helper module, not a test file)."""

from __future__ import annotations

import torch
from torch import nn


class NearestCenters(nn.Module):
    """Distances to learned centers (`torch.cdist`, no DTensor rule) between two Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(16, 32)
        self.centers = nn.Parameter(torch.randn(8, 32))
        self.decode = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(torch.cdist(self.encode(x), self.centers))


def nearest_centers() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return NearestCenters(), (torch.randn(8, 16),)
