"""What one rank of the runtime saves for backward, counted by `runtime.activation_counter`,
equals the Plan's prediction (`cost_models.saved_activations.tessel_stage`) byte for byte:
the zoo GPT and Llama, every recompute mode, whole and split over two tensor ranks (with
and without sequence parallelism), grouped keys and values, a context-parallel rank, and
under LoRA (a frozen base, adapters on some or all of the linears). Each
runs a one-stage plan's step in this process as rank 0 (or 1) of a fake process group:
collectives do nothing, shapes and saved tensors are the real rank's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.vocabulary.parallel import ParallelConfig
from planner.plans.transformer_plan import training_plan
from runtime.spec import from_training_plan
from runtime.pipeline_trainer import PipelineTrainer
from runtime.training_loop import batches

SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16)
SPLITS = {"t1": dict(tensor=1), "t2": dict(tensor=2),
          "t2-sp": dict(tensor=2, sequence_parallel=True)}


def _measure(model: TransformerConfig, knobs: dict, rank: int = 0):
    """(measured per micro-batch, predicted) for `rank` of a one-stage plan."""
    world = knobs.get("tensor", 1) * knobs.get("context", 1)
    parallel = ParallelConfig.of(micro_batch_size=2, global_batch_size=4, precision="fp32",
                              engine="tessel", **knobs)
    plan = training_plan("test", model, Cluster.load("cpu").with_devices(world), parallel)
    spec = from_training_plan(plan)
    if dist.is_initialized():
        dist.destroy_process_group()  # a fake group an earlier plan on a mesh left
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        trainer = PipelineTrainer(model, spec, count_activations=True)
        trainer.step(*batches(model, spec, 1)[0])
    finally:
        dist.destroy_process_group()
    (predicted,) = plan.stages[0].saved_activation_bytes
    (measured,) = trainer.saved_activation_bytes().values()
    return measured, predicted


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_stage_saves_what_the_plan_predicts(family: str) -> None:
    torch.set_num_threads(1)
    model = TransformerConfig(**SHAPE, **FAMILIES[family])
    seen = {}
    for recompute in ("none", "selective", "full"):
        for split, knobs in SPLITS.items():
            measured, predicted = _measure(model, dict(recompute=recompute, **knobs))
            assert measured == [predicted] * 2, (recompute, split)
            seen[recompute, split] = predicted
    # Tensor parallelism splits the heads and the MLP; sequence parallelism the norms too;
    # selective recomputation drops SDPA's log-sum-exp; full keeps each block's input.
    for split in SPLITS:
        assert seen["none", split] > seen["selective", split] > seen["full", split]
    assert seen["none", "t1"] > seen["none", "t2"] > seen["none", "t2-sp"]


@pytest.mark.parametrize("groups, tensor, context", [(2, 2, 1), (2, 1, 1), (2, 1, 2)])
def test_grouped_keys_and_context_parallelism_are_counted(groups, tensor, context) -> None:
    # Two key/value heads over two tensor ranks: one per rank, which repeat_kv only views;
    # over one rank it copies them to every query head. A context-parallel rank (the
    # second) keeps the keys and values of the whole sequence and its mask.
    model = TransformerConfig(**SHAPE, **FAMILIES["llama"], num_query_groups=groups)
    for recompute in ("none", "selective"):
        measured, predicted = _measure(
            model, dict(tensor=tensor, context=context, recompute=recompute),
            rank=context - 1)
        assert measured == [predicted] * 2, recompute


LORA = dict(finetune="lora", lora_rank=4)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_lora_stage_saves_what_the_plan_predicts(family: str) -> None:
    # The frozen base keeps what only its weights' gradients read no more (a linear's
    # input, a norm scale's normalised input, the embedding's ids, the head's input) and
    # the first block's input requires no grad; the adapters keep their inputs and x A^T.
    torch.set_num_threads(1)
    model = TransformerConfig(**SHAPE, **FAMILIES[family])
    for recompute in ("none", "selective", "full"):
        for split, knobs in SPLITS.items():
            measured, predicted = _measure(model, dict(recompute=recompute, **LORA, **knobs))
            full, _ = _measure(model, dict(recompute=recompute, **knobs))
            assert measured == [predicted] * 2, (recompute, split)
            assert predicted < full[0], (recompute, split)


@pytest.mark.parametrize("targets", [("linear_fc1", "linear_fc2"), ("linear_proj",),
                                     ("linear_qkv",), ("linear_fc2",)])
def test_lora_targets_decide_what_the_first_block_saves(targets) -> None:
    # Without adapters on q, k and v the first block's attention records nothing until
    # o_proj's adapter (or the MLP's) makes its output require grad, and selective
    # recomputation checkpoints no core whose q, k and v need no grad
    # (`runtime.stages.needs_grad`). Grouped keys and values over one and two tensor ranks
    # (with sequence parallelism), a context rank.
    torch.set_num_threads(1)
    model = TransformerConfig(**SHAPE, **FAMILIES["llama"], num_query_groups=2)
    for recompute in ("none", "selective", "full"):
        for knobs, rank in ((dict(tensor=1), 0), (dict(tensor=2, sequence_parallel=True), 1),
                            (dict(context=2), 1)):
            measured, predicted = _measure(
                model, dict(recompute=recompute, lora_targets=targets, **LORA, **knobs), rank)
            assert measured == [predicted] * 2, (recompute, knobs)
