"""runtime.hf.layout, without processes: the tensor-parallel layout a Hugging Face decoder
layer gets from the module rule (column-parallel: the linears reading a sublayer's input;
row-parallel: the one writing its output), and the exact rows each tensor rank holds of a
fused q/k/v and a fused gate/up."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard

pytest.importorskip("transformers")

from planner.vocabulary.parallel_dims import ParallelDims  # noqa: E402
from runtime.hf.layout import block_layout  # noqa: E402
from runtime.mesh import build_mesh  # noqa: E402

_SHAPE = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "vocab_size": 128, "max_position_embeddings": 64, "intermediate_size": 96,
          "tie_word_embeddings": False}
PHI3 = {"model_type": "phi3", **_SHAPE, "num_key_value_heads": 4, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 1}
GPT_NEOX = {"model_type": "gpt_neox", **_SHAPE, "use_parallel_residual": True}
GEMMA2 = {"model_type": "gemma2", **_SHAPE, "num_key_value_heads": 2, "head_dim": 16}
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_inner": 96,
        "vocab_size": 128, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}


def _stage(fields: dict):
    from runtime.hf import stages

    config = stages.hf_config_from_dict(fields)
    return config, stages.build_hf_stage(config, (0, 2), True, True)


@pytest.mark.parametrize(("fields", "column", "row", "norms"), [
    (PHI3, {"self_attn.qkv_proj": 3, "mlp.gate_up_proj": 2},
     ["self_attn.o_proj", "mlp.down_proj"], ["input_layernorm", "post_attention_layernorm"]),
    (GPT_NEOX, {"attention.query_key_value": 1, "mlp.dense_h_to_4h": 1},
     ["attention.dense", "mlp.dense_4h_to_h"], ["input_layernorm", "post_attention_layernorm"]),
    (GEMMA2, {"self_attn.q_proj": 1, "self_attn.k_proj": 1, "self_attn.v_proj": 1,
              "mlp.gate_proj": 1, "mlp.up_proj": 1},
     ["self_attn.o_proj", "mlp.down_proj"],
     ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
      "post_feedforward_layernorm"]),
    (GPT2, {"attn.c_attn": 3, "mlp.c_fc": 1}, ["attn.c_proj", "mlp.c_proj"],
     ["ln_1", "ln_2"]),
], ids=["phi3", "gpt_neox", "gemma2", "gpt2"])
def test_the_rule_finds_each_family_s_column_and_row_parallel_linears(
        fields, column, row, norms) -> None:
    config, stage = _stage(fields)
    layout = block_layout(stage.layers["0"], config, stage.rotary)
    assert {n: p for s in layout.sublayers for n, p in s.column.items()} == column
    assert [n for s in layout.sublayers for n in s.row] == row
    assert layout.norms == norms
    attention = [s for s in layout.sublayers if s.attention is not None]
    assert len(attention) == 1 and attention[0].name == attention[0].attention


def _rank_shards(fields: dict, rank: int, fake_world, zero_stage: int) -> tuple[dict, dict]:
    """Rank `rank` of dp2 x tp2: its local pieces of the parameters after tensor
    parallelism and data parallelism at `zero_stage` (FSDP2), and the whole model's."""
    from transformers import CONFIG_MAPPING

    from planner.models.hf_shape import to_transformer_config
    from runtime.model_parts import model_parts
    from runtime.parallelize import apply_data_parallel

    fake_world(rank, 4)
    mesh = build_mesh(ParallelDims(data=2, tensor=2))
    shape = to_transformer_config(CONFIG_MAPPING[fields["model_type"]].from_dict(fields), 16)
    parts = model_parts(shape, fields)
    stage = parts.build_stage((0, 2), True, True)
    parts.tensor_parallel(stage, mesh["tp"], False)
    apply_data_parallel(stage, mesh["dp"], zero_stage=zero_stage)
    parts.materialize(stage, seed=0)
    full = dict(parts.reference(seed=0).named_parameters())
    return dict(stage.named_parameters()), full


def test_a_fused_qkv_and_gate_up_shard_by_heads_and_rows(fake_world) -> None:
    """Phi-3's qkv_proj [q; k; v] (4 heads of 16, no grouping): tensor rank t holds
    [q_t; k_t; v_t] (heads 2t, 2t+1 of each), not a contiguous third; gate_up_proj
    [gate; up]: [gate_t; up_t]; down_proj its input columns (ZeRO-0: whole over dp).
    Rank 1 of dp2 x tp2: tensor rank 1."""
    params, full = _rank_shards(PHI3, 1, fake_world, zero_stage=0)
    tensor = 1
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert isinstance(qkv, DTensor) and _StridedShard(0, split_factor=3) in qkv.placements
    q, k, v = full["model.layers.0.self_attn.qkv_proj.weight"].split(64)
    mine = torch.cat([part[32 * tensor: 32 * (tensor + 1)] for part in (q, k, v)])
    assert torch.equal(qkv.to_local(), mine)
    gate_up = params["model.layers.0.mlp.gate_up_proj.weight"]
    assert _StridedShard(0, split_factor=2) in gate_up.placements
    gate, up = full["model.layers.0.mlp.gate_up_proj.weight"].split(96)
    mine = torch.cat([part[48 * tensor: 48 * (tensor + 1)] for part in (gate, up)])
    assert torch.equal(gate_up.to_local(), mine)
    down = params["model.layers.0.mlp.down_proj.weight"]  # row-parallel: input columns
    want = full["model.layers.0.mlp.down_proj.weight"][:, 48 * tensor: 48 * (tensor + 1)]
    assert torch.equal(down.to_local(), want)


def test_gpt2_s_conv1d_c_attn_splits_its_transposed_weight_by_heads(fake_world) -> None:
    """GPT-2's c_attn is a Conv1D, weight [in, q | k | v]: tensor rank 1 holds the
    columns of its heads of each part, [q_1 | k_1 | v_1], and the bias likewise; c_proj
    its rows (the input dim of a transposed weight)."""
    params, full = _rank_shards(GPT2, 1, fake_world, zero_stage=0)
    c_attn = params["transformer.h.0.attn.c_attn.weight"]
    assert _StridedShard(1, split_factor=3) in c_attn.placements
    for name, dim in (("weight", 1), ("bias", 0)):
        whole = full[f"transformer.h.0.attn.c_attn.{name}"]
        mine = torch.cat([part.narrow(dim, 32, 32) for part in whole.split(64, dim)], dim)
        assert torch.equal(params[f"transformer.h.0.attn.c_attn.{name}"].to_local(), mine)
    c_proj = params["transformer.h.0.attn.c_proj.weight"]
    assert torch.equal(c_proj.to_local(), full["transformer.h.0.attn.c_proj.weight"][32:])


def test_a_per_head_split_fused_projection_is_not_zero_sharded_under_tensor_parallelism(
) -> None:
    """FSDP2 would cut the rank's [q_t; k_t; v_t] into row chunks that straddle q, k and
    v, which no DTensor placement states: refused in one line naming the fix."""
    from transformers import CONFIG_MAPPING

    from planner.models.hf_shape import to_transformer_config
    from runtime.model_parts import model_parts
    from runtime.spec import RunSpec, even_chunks

    shape = to_transformer_config(CONFIG_MAPPING["phi3"].from_dict(PHI3), 16)
    spec = RunSpec(degrees=ParallelDims(data=2, tensor=2), chunks=even_chunks(2, 1),
                   micro_batch_size=1, num_micro_batches=1, zero_stage=3)
    with pytest.raises(ValueError, match="--zero-stage 0") as refused:
        model_parts(shape, PHI3).check(spec)
    assert "qkv_proj" in str(refused.value) and "\n" not in str(refused.value)
    model_parts(shape, PHI3).check(replace(spec, zero_stage=0))


def test_gpt_neox_per_head_query_key_value_is_a_plain_row_split(fake_world) -> None:
    """GPT-NeoX's query_key_value interleaves q, k, v per head ([h0: q k v; h1: ...]):
    tensor rank 1 holds the second half of the rows, its heads' q, k and v whole, and
    ZeRO-3 splits that half over the data ranks (rank 1: data rank 0)."""
    params, full = _rank_shards(GPT_NEOX, 1, fake_world, zero_stage=3)
    qkv = params["gpt_neox.layers.0.attention.query_key_value.weight"]
    assert qkv.placements[1] == Shard(0)
    whole = full["gpt_neox.layers.0.attention.query_key_value.weight"]
    assert torch.equal(qkv.to_local(), whole[96:].chunk(2)[0])
    bias = params["gpt_neox.layers.0.attention.query_key_value.bias"]
    assert torch.equal(bias.to_local(), full["gpt_neox.layers.0.attention.query_key_value.bias"]
                       [96:].chunk(2)[0])


def test_grouped_query_heads_in_one_fused_projection_are_refused() -> None:
    """Phi-3 with 4 query and 2 key/value heads in one qkv_proj: no alike split of its
    parts gives a rank exactly its heads' rows, so tensor parallelism refuses it."""
    config, stage = _stage({**PHI3, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="grouped-query attention in one projection"):
        block_layout(stage.layers["0"], config, stage.rotary)
