"""A ~1B-parameter model of 200 distinct layers, for planning benchmarks (issue 12).

No block repeats: each of the 200 `nn.Linear` layers is its own named attribute (no
`ModuleList` or `Sequential`), their widths vary between 2048 and 2560 (multiples of 64,
so that every width splits over 64 devices) and the activation after each one cycles
through ReLU, GELU, SiLU and tanh with a period prime to the widths' pattern. So the
planner cannot lean on repeated templates: it traces the whole model and clusters its
operators into layers (`passes.stage_graph.layer_cuts`).

The model is built on the meta device and its example input is a meta tensor, so building
and planning it allocate no parameter memory:

    .venv/bin/python -m planner benchmarks/distinct_layers.py:distinct_layers \\
        --gpus 64 --cluster aws-p3.16xlarge --global-batch-size 1024
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NUM_LAYERS = 200
MIN_WIDTH = 2048
WIDTH_STEP = 64
WIDTH_STEPS = 9
"""Widths are MIN_WIDTH + WIDTH_STEP * k for k in 0..WIDTH_STEPS - 1 (2048..2560)."""
ACTIVATIONS = (F.relu, F.gelu, F.silu, torch.tanh)
BATCH = 8


def widths(num_layers: int = NUM_LAYERS) -> list[int]:
    """num_layers + 1 feature widths: layer i maps widths[i] -> widths[i + 1]. The step
    pattern (7 k mod 9, a permutation of 0..8) mixes widths rather than ramping them."""
    return [MIN_WIDTH + WIDTH_STEP * (7 * k % WIDTH_STEPS) for k in range(num_layers + 1)]


class DistinctLayers(nn.Module):
    """`fc000` ... `fc199`, each followed by an activation; the last one by none."""

    def __init__(self, num_layers: int = NUM_LAYERS) -> None:
        super().__init__()
        self.names = [f"fc{i:03d}" for i in range(num_layers)]
        features = widths(num_layers)
        for i, name in enumerate(self.names):
            setattr(self, name, nn.Linear(features[i], features[i + 1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.names) - 1
        for i, name in enumerate(self.names):
            x = getattr(self, name)(x)
            if i < last:
                x = ACTIVATIONS[i % len(ACTIVATIONS)](x)
        return x


def distinct_layers() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model on the meta device and a meta input of shape [BATCH, widths()[0]]."""
    with torch.device("meta"):
        model = DistinctLayers()
        return model, (torch.empty(BATCH, widths()[0]),)


def num_parameters() -> int:
    return sum(p.numel() for p in distinct_layers()[0].parameters())


if __name__ == "__main__":
    print(f"{NUM_LAYERS} layers, {num_parameters() / 1e9:.2f} B parameters")
