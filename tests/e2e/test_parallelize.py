"""`planner.parallelize` on the ranks of an initialized process group: it trains like one
process, and the plan travels between ranks as JSON text, never pickled."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist

from planner.checks.operator import train_single_process
from planner.models import demo
from runtime.local_ranks import run_on_ranks

sys.path.insert(0, str(Path(__file__).parent))


def _model():
    torch.manual_seed(0)
    return demo.mlp(batch=8, in_features=32, hidden=64, out_features=16)


def _no_pickle(*args, **kwargs):
    raise AssertionError("parallelize sent an object with pickle")


def _forbid_pickled_objects() -> Callable[[], None]:
    """Make every torch.distributed *_object collective fail in this rank; returns what
    undoes it."""
    c10d = dist.distributed_c10d
    saved = (dist.broadcast_object_list, c10d.broadcast_object_list, c10d._object_to_tensor,
             c10d._tensor_to_object)
    dist.broadcast_object_list = _no_pickle
    c10d.broadcast_object_list = _no_pickle
    c10d._object_to_tensor = _no_pickle
    c10d._tensor_to_object = _no_pickle

    def allow() -> None:
        (dist.broadcast_object_list, c10d.broadcast_object_list, c10d._object_to_tensor,
         c10d._tensor_to_object) = saved

    return allow


def _train_with_parallelize(rank: int, world: int, batches):
    import logging

    import planner

    _forbid_pickled_objects()
    model, inputs = _model()
    told: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: told.append(record.getMessage())
    logging.getLogger("planner").addHandler(handler)
    plan, trainer = planner.parallelize(model, inputs, mesh_shape=(world,), cluster="cpu")
    losses = [trainer.step(*batch) for batch in batches]
    return plan.to_json(), losses, trainer.full_parameters(), told


def test_parallelize_trains_like_one_process() -> None:
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 32, generator=generator),) for _ in range(3)]
    results = run_on_ranks(_train_with_parallelize, 2, batches)
    plans = {plan for plan, _, _, _ in results}
    assert len(plans) == 1, "every rank runs the plan rank 0 made"
    # The tiny MLP on gloo is best replicated, and rank 0 (only) says why, with the numbers.
    [told], nothing = results[0][3], results[1][3]
    assert told.startswith("replicated: each of the 2 ranks computes the whole step") \
        and not nothing
    model, _ = _model()
    reference_losses, reference_params = train_single_process(model, None, batches)
    for _, losses, params, _ in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses))
        for name, value in reference_params.items():
            torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5)


def _parallelize_with_rank_0_unable_to_plan(rank: int, world: int):
    import planner
    import planner.api

    if rank == 0:
        def fail(*args, **kwargs):
            raise ValueError("no strategy fits")

        planner.api.plan_model = fail
    model, inputs = _model()
    planner.parallelize(model, inputs, mesh_shape=(world,), cluster="cpu")


def _rank_1_error(rank: int, world: int):
    try:
        _parallelize_with_rank_0_unable_to_plan(rank, world)
    except RuntimeError as error:
        return str(error)
    except ValueError:
        return None
    return "planned"


def test_when_rank_0_cannot_plan_the_other_ranks_stop_instead_of_waiting() -> None:
    with pytest.raises(RuntimeError, match="rank 0 failed: ValueError: no strategy fits"):
        run_on_ranks(_parallelize_with_rank_0_unable_to_plan, 2)
    assert run_on_ranks(_rank_1_error, 2)[1] == (
        "rank 0 could not plan the model; its error says why"
    )


# -- graph plans: parallelize(..., gpus=N, global_batch_size=B) ---------------------------

SMALL_MEMORY = str(Path(__file__).parents[1] / "fixtures" / "small_memory.yaml")


def _graph_model(seed: int = 0):
    from graph_models import narrow_mlp

    model, inputs = narrow_mlp()
    torch.manual_seed(seed)
    if seed:  # another starting point
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter)
    return model, inputs


def _train_save_resume(rank: int, world: int, batches, directory: str):
    import planner
    from runtime.graph_pipeline import StagedTrainer

    allow = _forbid_pickled_objects()
    model, inputs = _graph_model()
    plan, trainer = planner.parallelize(model, inputs, cluster=SMALL_MEMORY, gpus=world,
                                        global_batch_size=16, micro_batch_size=4)
    allow()  # torch.distributed.checkpoint agrees on its save plans with pickled objects
    losses = [trainer.step(*batch) for batch in batches[:2]]
    trainer.save(directory)
    # A job restarted from the checkpoint: another initial model, then the saved state.
    other, _ = _graph_model(seed=7)
    resumed = StagedTrainer(plan, other, inputs)
    resumed.load(directory)
    losses.append(resumed.step(*batches[2]))
    return plan.to_json(), losses, resumed.full_parameters()


def test_parallelize_a_graph_plan_trains_saves_and_resumes_like_one_process(tmp_path) -> None:
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 32, generator=generator),) for _ in range(3)]
    results = run_on_ranks(_train_save_resume, 4, batches, str(tmp_path))
    assert len({plan for plan, _, _ in results}) == 1
    model, _ = _graph_model()
    reference_losses, reference_params = train_single_process(model, None, batches)
    last_stage = [losses for _, losses, _ in results if losses[0] is not None]
    assert last_stage, "the last stage's ranks report the loss"
    for losses in last_stage:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses))
    params = {name: value for _, _, stage in results for name, value in stage.items()}
    assert set(params) == set(reference_params)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5)


def _parallelize_with_knobs(rank: int, world: int, batches):
    import planner

    model, inputs = _graph_model()
    knobs = planner.GraphKnobs(schedule="gpipe", recompute=True, precision="bf16", lean=True)
    plan, trainer = planner.parallelize(model, inputs, cluster=SMALL_MEMORY, gpus=world,
                                        global_batch_size=16, micro_batch_size=4,
                                        knobs=knobs)
    losses = [trainer.step(*batch) for batch in batches]
    return plan.to_json(), losses


def test_parallelize_a_graph_plan_with_fixed_knobs(tmp_path) -> None:
    # The knobs reach the plan rank 0 makes and the trainers every rank runs: GPipe, every
    # stage but the last recomputing, bf16 with fp32 master weights, ZeRO-3 (which rules
    # out the replicated data parallelism that would win on 4 devices: a pipeline wins).
    from planner.checks.operator import RELATIVE_TOLERANCE_BF16
    from planner.vocabulary.plan import Plan

    generator = torch.Generator().manual_seed(5)
    batches = [(torch.randn(16, 32, generator=generator),) for _ in range(2)]
    results = run_on_ranks(_parallelize_with_knobs, 4, batches)
    plan = Plan.from_json(results[0][0])
    assert (plan.schedule, plan.precision) == ("gpipe", "bf16") and len(plan.stages) > 1
    assert [s.recompute for s in plan.stages] == [True] * (len(plan.stages) - 1) + [False]
    model, _ = _graph_model()
    reference_losses, _ = train_single_process(model, None, batches, "bf16")
    last_stage = [losses for _, losses in results if losses[0] is not None]
    for losses in last_stage:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses),
                                   rtol=RELATIVE_TOLERANCE_BF16, atol=0)
