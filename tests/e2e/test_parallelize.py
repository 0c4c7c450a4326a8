"""`planner.parallelize` on the ranks of an initialized process group."""

from __future__ import annotations

import torch

from planner.check import train_single_process
from planner.models import demo
from runtime.launch import run_on_ranks


def _model():
    torch.manual_seed(0)
    return demo.mlp(batch=8, in_features=32, hidden=64, out_features=16)


def _train_with_parallelize(rank: int, world: int, batches):
    import planner

    model, inputs = _model()
    plan, trainer = planner.parallelize(model, inputs, mesh_shape=(world,), cluster="cpu")
    losses = [trainer.step(*batch) for batch in batches]
    return plan.to_json(), losses, trainer.full_parameters()


def test_parallelize_trains_like_one_process() -> None:
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 32, generator=generator),) for _ in range(3)]
    results = run_on_ranks(_train_with_parallelize, 2, batches)
    plans = {plan for plan, _, _ in results}
    assert len(plans) == 1, "every rank runs the plan rank 0 made"
    model, _ = _model()
    reference_losses, reference_params = train_single_process(model, None, batches)
    for _, losses, params in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses))
        for name, value in reference_params.items():
            torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5)
