"""Train a planned model on the ranks of an initialized process group.

Holds this rank's shards of the parameters and buffers as plain tensors, runs the
per-rank program (`passes.lower.RankProgram`) for forward and backward, and updates the
shards with AdamW. AdamW is elementwise, so updating each shard on its own gives exactly
the single-device update of the full parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from passes.lower import RankProgram
from runtime.checkpoint import Checkpointing, ShardsState
from runtime.faults import bound_timeouts


def training_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, non-persistent buffers (rotary tables) included."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {name: value.detach().clone() for name, value in named}


# The optimizer both the sharded run and the single-process reference use.
DEFAULT_OPTIMIZER = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


class ShardedTrainer(Checkpointing):
    """Forward, backward and AdamW step of one rank; `save(root)` / `load(path)`
    checkpoint it (`runtime.checkpoint`: a checkpoint loads onto another plan too)."""

    def __init__(
        self,
        rank_program: RankProgram,
        state_dict: dict[str, torch.Tensor],
        optimizer: dict[str, Any] | None = None,
    ) -> None:
        self.rank_program = rank_program
        bound_timeouts(rank_program.mesh.get_all_groups())  # subgroups: 30 min otherwise
        program = rank_program.program
        placements = rank_program.parameter_placements()
        self.params = {
            fqn: rank_program.shard(state_dict[fqn], placements[fqn])
            for fqn in program.parameters.values()
        }
        self.buffers = {
            fqn: rank_program.shard(state_dict[fqn], rank_program.replicated)
            for fqn in program.buffers.values()
        }
        # The optimizer owns the local shards; DTensors are views of them.
        self.locals = {fqn: p.to_local().detach().clone() for fqn, p in self.params.items()}
        self.optimizer = torch.optim.AdamW(
            list(self.locals.values()), **(optimizer or DEFAULT_OPTIMIZER)
        )

    def _dtensors(self) -> dict[str, DTensor]:
        return {
            fqn: DTensor.from_local(
                self.locals[fqn], p.device_mesh, p.placements, run_check=False,
                shape=p.shape, stride=p.stride(),
            )
            for fqn, p in self.params.items()
        }

    def step(self, *batch: torch.Tensor) -> float:
        """One training step on a full batch (every rank passes the same one); returns the
        loss."""
        inputs = self.rank_program.shard_inputs(tuple(batch))
        with torch.no_grad():
            loss, grads = self.rank_program.run(self._dtensors(), self.buffers, inputs)
            for fqn, grad in grads.items():
                self.locals[fqn].grad = grad.to_local().detach().clone()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return float(loss)

    def checkpoint_state(self) -> ShardsState:
        """This rank's shards and AdamW state as DTensors of the plan's layouts."""
        return ShardsState(self.params, self.locals, self.optimizer)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered in full (a collective: call it on every rank)."""
        return {fqn: p.full_tensor() for fqn, p in self._dtensors().items()}
