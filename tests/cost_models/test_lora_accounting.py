"""What a LoRA plan's ranks hold and issue (`cost_models.finetuned_parameters`,
`cost_models.stage_parameters`, `cost_models.training_collectives`), without processes:
the adapters listed beside their frozen linears, no gradient or optimizer state for the
base, data-parallel reduction of the adapters only, one tensor-parallel all-reduce per
replicated factor, and no gradient reduction where only frozen parameters come before
(tests/e2e/test_lora_plan_check.py measures the same on ranks)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cost_models.adapters import NF4_BYTES
from cost_models.memory import state_element_bytes
from cost_models.finetuned_parameters import finetuned_chunk
from cost_models.stage_parameters import chunk_parameters, rank_state_bytes
from cost_models.step_time import rank_layout
from cost_models.training_collectives import (
    GradientFlow,
    first_layer_flow,
    rank_collectives,
)
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import Finetuning, ParallelConfig

LLAMA = TransformerConfig(**FAMILIES["llama"], num_layers=4, hidden_size=64,
                          num_attention_heads=4, num_query_groups=2, vocab_size=256,
                          seq_length=16)
RANK = 4
LORA = Finetuning(finetune="lora", lora_rank=RANK)
# One layer's adapters, r (in + out) per adapted linear: q (64 <- 64), k and v (32 <- 64),
# o (64 <- 64), gate and up (256 <- 64), down (64 <- 256).
LAYER_ADAPTERS = RANK * (128 + 96 + 96 + 128 + 320 + 320 + 320)


def _plan(**knobs):
    parallel = ParallelConfig.of(**{
        "tensor": 2, "pipeline": 1, "data": 2, "global_batch_size": 8, "micro_batch_size": 2,
        "zero_stage": 2, "precision": "fp32", "engine": "tessel", **knobs})
    return training_plan("llama-tiny", LLAMA, Cluster.load("cpu").with_devices(4), parallel)


def test_a_lora_chunk_lists_each_adapter_after_its_frozen_linear() -> None:
    base = chunk_parameters(LLAMA, (0, 2), True, False)
    lora = finetuned_chunk(LLAMA, (0, 2), True, False, LORA)
    assert finetuned_chunk(LLAMA, (0, 2), True, False, Finetuning(finetune="full")) == base
    assert not any(p.frozen for p in base)
    adapters = [p for p in lora if not p.frozen]
    assert [p for p in lora if p.frozen] == [replace(p, frozen=True) for p in base]
    assert len(adapters) == 2 * 7 * 2 and all(".lora_" in p.name for p in adapters)
    assert sum(math.prod(p.shape) for p in adapters) == 2 * LAYER_ADAPTERS
    names = [p.name for p in lora]
    q = names.index("layers.0.attn.q_proj.weight")
    assert names[q + 1: q + 3] == ["layers.0.attn.q_proj.lora_a.weight",
                                   "layers.0.attn.q_proj.lora_b.weight"]
    # Only the targets' linears: the MLP's alone.
    mlp = finetuned_chunk(LLAMA, (0, 1), False, False,
                           replace(LORA, lora_targets=("linear_fc1", "linear_fc2")))
    assert {p.name.split(".")[-3] for p in mlp if not p.frozen} == {
        "gate_proj", "up_proj", "down_proj"}


def test_a_frozen_base_holds_no_gradient_and_no_optimizer_state() -> None:
    params = finetuned_chunk(LLAMA, (0, 4), True, True, LORA)
    whole = sum(math.prod(p.shape) for p in params)
    fp32 = state_element_bytes("fp32")
    assert rank_state_bytes(params, 1, 1, 0, 1, None, fp32) == (
        4 * whole, 4 * 4 * LAYER_ADAPTERS, 8 * 4 * LAYER_ADAPTERS)
    # ZeRO-3 over 2 ranks: every parameter's and the adapters' state halved.
    assert rank_state_bytes(params, 1, 2, 3, 1, None, fp32) == (
        2 * whole, 2 * 4 * LAYER_ADAPTERS, 4 * 4 * LAYER_ADAPTERS)
    # QLoRA: the adapted linears' weights in NF4, the rest of the base in bf16.
    qlora = finetuned_chunk(LLAMA, (0, 4), True, True, replace(LORA, finetune="qlora"))
    adapted = sum(math.prod(p.shape) for p in qlora if p.element_bytes is not None)
    assert adapted == 4 * (64 * 64 * 2 + 32 * 64 * 2 + 256 * 64 * 3)
    mixed = state_element_bytes("bf16")
    assert rank_state_bytes(qlora, 1, 1, 0, 1, None, mixed) == (
        math.ceil(adapted * NF4_BYTES + 2 * (whole - 4 * LAYER_ADAPTERS - adapted)
                  + 2 * 4 * LAYER_ADAPTERS),
        4 * 4 * LAYER_ADAPTERS, 12 * 4 * LAYER_ADAPTERS)


def test_a_lora_plan_places_the_adapters_as_megatron_bridge_splits_them() -> None:
    plan = _plan(finetune="lora", lora_rank=RANK)
    stage = plan.stages[0]
    assert plan.run.finetune == "lora" and plan.run.lora_rank == RANK
    placements = stage.parameters
    # Column-parallel q: A whole over the tensor ranks, B split by rows like q; row-
    # parallel o: A split by columns like o, B whole; ZeRO shards dim 0 of each.
    assert placements["layers.0.attn.q_proj.weight"] == "_S(0,2)S(0)"
    assert placements["layers.0.attn.q_proj.lora_a.weight"] == "S(0)R"
    assert placements["layers.0.attn.q_proj.lora_b.weight"] == "_S(0,2)S(0)"
    assert placements["layers.3.mlp.down_proj.lora_a.weight"] == "S(0)S(1)"
    assert placements["layers.3.mlp.down_proj.lora_b.weight"] == "S(0)R"
    assert sum(".lora_" in name for name in placements) == 4 * 14
    # ZeRO-2 over data 2, tensor 2: the adapters' gradients and optimizer state only.
    local = sum(math.prod(p.shape) // (2 if p.tensor_dim is not None else 1)
                for p in finetuned_chunk(LLAMA, (0, 4), True, True, LORA) if not p.frozen)
    assert stage.memory.gradients_bytes == 4 * local // 2
    assert stage.memory.optimizer_bytes == 8 * local // 2
    # Pre-training and full fine-tuning are priced alike.
    assert _plan(finetune="full").stages[0].memory == _plan().stages[0].memory
    assert _plan(finetune="full").stages[0].communication == _plan().stages[0].communication


def _collectives(finetuning: Finetuning, **knobs):
    parallel = ParallelConfig.of(**{
        "tensor": 2, "data": 2, "global_batch_size": 8, "micro_batch_size": 2,
        "zero_stage": 2, "precision": "fp32", "sequence_parallel": True, **knobs})
    layout = replace(rank_layout(parallel, ((0, 4),), (0,)), finetuning=finetuning)
    return rank_collectives(LLAMA, layout, 0)


def _count(collectives, kind: str, axis: str, phase: str) -> tuple[int, int]:
    found = [c for c in collectives if (c.kind, c.axis, c.phase) == (kind, axis, phase)]
    return sum(c.count for c in found), sum(c.count * c.bytes for c in found)


def test_a_lora_rank_reduces_the_adapters_gradients_only() -> None:
    lora, base = _collectives(LORA), _collectives(Finetuning())
    # Over the data ranks: one reduce-scatter per layer, of its adapters; none for the
    # frozen embedding, final norm and head; every parameter still gathered.
    local = 4 * sum(math.prod(p.shape) // (2 if p.tensor_dim is not None else 1)
                    for p in finetuned_chunk(LLAMA, (0, 4), True, True, LORA)
                    if not p.frozen)
    assert _count(lora, "reduce_scatter", "dp", "gradient_sync") == (4, local)
    assert _count(base, "reduce_scatter", "dp", "gradient_sync")[0] == 5
    assert _count(lora, "all_gather", "dp", "forward")[0] == 5
    # Over the tensor ranks: one all-reduce per replicated factor (A of q, k, v, gate, up;
    # B of o and down: r x 64 each), none of the frozen sequence-parallel norms.
    assert _count(lora, "all_reduce", "tp", "gradient_sync") == (4 * 7, 4 * 7 * RANK * 64 * 4)
    assert _count(base, "all_reduce", "tp", "backward")[0] == 2 * 4 + 1  # the norms'
    assert _count(lora, "all_reduce", "tp", "backward") == (0, 0)
    # Without data parallelism DTensor reduces them once per micro-batch.
    alone = _collectives(LORA, data=1, global_batch_size=4)
    assert _count(alone, "all_reduce", "tp", "gradient_sync")[0] == 2 * 4 * 7


@pytest.mark.parametrize(("targets", "fewer_scatters", "fewer_gathers"), [
    # The first layer's input (after the frozen embedding) gets no gradient, nor does the
    # embedding's output: one reduce-scatter and one all-gather fewer per micro-batch.
    (("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"), 1, 1),
    # Only the MLP's down projection adapted: nor do its attention's output and the MLP's
    # input.
    (("linear_fc2",), 2, 2),
])
def test_no_gradient_reaches_what_only_frozen_parameters_precede(
        targets, fewer_scatters, fewer_gathers) -> None:
    lora = _collectives(replace(LORA, lora_targets=targets))
    base = _collectives(Finetuning())
    micro_batches = 2
    for kind, fewer in (("reduce_scatter", fewer_scatters), ("all_gather", fewer_gathers)):
        assert _count(lora, kind, "tp", "backward")[0] == \
            _count(base, kind, "tp", "backward")[0] - fewer * micro_batches, kind
    assert _count(lora, "all_gather", "tp", "forward") == \
        _count(base, "all_gather", "tp", "forward")


def test_the_first_layers_gradient_flow_follows_its_targets() -> None:
    assert first_layer_flow(("linear_qkv",)) == GradientFlow(
        attention_input=False, keys_values=True, attention_output=True, mlp_input=True,
        mlp_output=True)
    assert first_layer_flow(("linear_proj",)) == GradientFlow(
        attention_input=False, keys_values=False, attention_output=True, mlp_input=True,
        mlp_output=True)
    assert first_layer_flow(("linear_fc1",)) == GradientFlow(
        attention_input=False, keys_values=False, attention_output=False, mlp_input=False,
        mlp_output=True)
