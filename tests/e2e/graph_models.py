"""Models with no repeated blocks, for graph plans (helper module, not a test file).

`wide_mlp`: sixteen Linear layers of varying widths, each its own attribute (no
ModuleList: nothing repeats, so Alpa's operator clustering cuts the layers).
`residual_cnn`: residual blocks whose widths differ, with a classification loss the
factory names (cross-entropy on labels that are a model input).
`tied_mlp`: a weight read at both ends of the model (tied), so stages may share it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MLP_WIDTHS = (64, 96, 128, 160, 192, 224, 256, 224, 192, 160, 128, 96, 64, 96, 128, 96, 32)


class WideMLP(nn.Module):
    def __init__(self, widths: tuple[int, ...] = MLP_WIDTHS) -> None:
        super().__init__()
        self.depth = len(widths) - 1
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            setattr(self, f"fc{i}", nn.Linear(a, b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):
            x = getattr(self, f"fc{i}")(x)
            if i < self.depth - 1:
                x = torch.relu(x)
        return x


def wide_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return WideMLP(), (torch.randn(8, MLP_WIDTHS[0]),)


def narrow_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Four layers: quick to plan, for the command-line tests."""
    torch.manual_seed(0)
    return WideMLP((32, 48, 64, 40, 16)), (torch.randn(4, 32),)


class Residual(nn.Module):
    """conv-relu-conv with a skip (a 1x1 projection where the width changes)."""

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.skip = (nn.Conv2d(channels_in, channels_out, 1) if channels_in != channels_out
                     else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.skip(x))


class ResidualCNN(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (32, 64, 64, 128, 96), classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, padding=1)
        self.first = Residual(widths[0], widths[1])
        self.second = Residual(widths[1], widths[2])
        self.third = Residual(widths[2], widths[3])
        self.fourth = Residual(widths[3], widths[4])
        self.head = nn.Linear(widths[4], classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(images))
        x = self.fourth(self.third(self.second(self.first(x))))
        return self.head(x.mean(dim=(2, 3)))


def cross_entropy(logits: torch.Tensor, images: torch.Tensor,
                  labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def residual_cnn():
    torch.manual_seed(0)
    images = torch.randn(4, 3, 8, 8)
    labels = torch.randint(0, 10, (4,))
    return ResidualCNN(), (images, labels), cross_entropy


class TiedMLP(nn.Module):
    """Linear layers whose first weight is read again, transposed, as the output layer: a
    weight tied across the model's two ends, as a language model's embedding and head."""

    def __init__(self, width: int = 32, hidden: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.depth = depth
        self.fc0 = nn.Linear(width, hidden)
        for i in range(1, depth):
            setattr(self, f"fc{i}", nn.Linear(hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"fc{i}")(x))
        return F.linear(x, self.fc0.weight.t())


def tied_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TiedMLP(), (torch.randn(4, 32),)
