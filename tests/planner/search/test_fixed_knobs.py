"""Knobs given are knobs kept: every plan either search space returns honours every knob
the user fixed, in every stage of an auto-space plan (whose stages may differ in mesh)."""

from __future__ import annotations

import re

import pytest

from planner import cli
from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.models.presets import get_preset
from planner.search import search
from planner.search.megatron_space import Candidate

DENSE = get_preset("gpt3-1.3b")  # 24 layers, 16 heads
MOE = TransformerConfig(num_layers=8, hidden_size=1024, num_attention_heads=16,
                        vocab_size=32000, seq_length=2048, num_experts=8,
                        norm="rmsnorm", activation="swiglu", position_embedding="rope")
CLUSTER = Cluster.load("dgx-a100-80g").with_devices(16)
BATCH = 64


def stage_meshes(c: Candidate) -> list[tuple[int, int]]:
    """(tensor, data) of every stage."""
    if c.stages:
        return [(s.tensor, s.data) for s in c.stages]
    return [(c.parallel.dims.tensor, c.parallel.dims.data)] * c.parallel.dims.pipeline


def per_replica_micro_batch(c: Candidate) -> list[int]:
    """Each stage's sequences per micro-batch on one data-parallel replica."""
    whole = c.parallel.batch.micro_batch_size * c.parallel.dims.data
    return [whole // data for _, data in stage_meshes(c)]


def num_stages(c: Candidate) -> int:
    return len(c.stages) if c.stages else c.parallel.dims.pipeline


# knob: (fixed knobs, model, spaces, what every plan must show)
KEPT = {
    "tensor": ({"tensor": 2}, DENSE, ("auto", "megatron"),
               lambda c: all(t == 2 for t, _ in stage_meshes(c))),
    "pipeline": ({"pipeline": 4}, DENSE, ("auto", "megatron"),
                 lambda c: num_stages(c) == 4 and len(c.layers_per_stage) == 4),
    "virtual pipeline": ({"pipeline": 2, "virtual_pipeline": 3, "schedule": "interleaved"},
                         DENSE, ("auto", "megatron"),
                         lambda c: c.parallel.pipelining.virtual_pipeline == 3
                         and c.parallel.pipelining.schedule == "interleaved"
                         and num_stages(c) == 2),
    "context": ({"context": 2}, DENSE, ("auto", "megatron"),
                lambda c: c.parallel.dims.context == 2),
    "expert": ({"expert": 4}, MOE, ("auto", "megatron"),
               # Experts fold over a stage's tensor x context x data ranks (Megatron-Core's
               # parallel folding), each expert split over its expert-tensor ranks.
               lambda c: c.parallel.dims.expert == 4 and all(
                   t * c.parallel.dims.context * d % (4 * (c.parallel.dims.expert_tensor or t)) == 0
                   for t, d in stage_meshes(c))),
    "micro-batch": ({"micro_batch_size": 2}, DENSE, ("auto", "megatron"),
                    lambda c: per_replica_micro_batch(c) == [2] * num_stages(c)),
    "zero stage 3": ({"zero_stage": 3}, DENSE, ("auto",),
                     lambda c: c.parallel.sharding.zero_stage == 3),
    "zero stage 0": ({"zero_stage": 0}, DENSE, ("auto", "megatron"),
                     lambda c: c.parallel.sharding.zero_stage == 0),
    "recompute": ({"recompute": "selective"}, DENSE, ("auto", "megatron"),
                  lambda c: c.parallel.recomputation.recompute == "selective"),
    "sequence parallel on": ({"sequence_parallel": True}, DENSE, ("auto", "megatron"),
                             lambda c: c.parallel.sharding.sequence_parallel
                             and all(t > 1 for t, _ in stage_meshes(c))),
    "sequence parallel off": ({"sequence_parallel": False}, DENSE, ("auto", "megatron"),
                              lambda c: not c.parallel.sharding.sequence_parallel),
    "schedule gpipe": ({"schedule": "gpipe"}, DENSE, ("auto",),
                       lambda c: c.parallel.pipelining.schedule == "gpipe"),
    "schedule 1f1b": ({"schedule": "1f1b"}, DENSE, ("auto", "megatron"),
                      lambda c: c.parallel.pipelining.schedule == "1f1b"),
    "schedule interleaved": ({"schedule": "interleaved"}, DENSE, ("auto", "megatron"),
                             lambda c: c.parallel.pipelining.schedule == "interleaved"
                             and c.parallel.pipelining.virtual_pipeline > 1),
    "overlap off": ({"overlap_grad_reduce": False}, DENSE, ("auto", "megatron"),
                    lambda c: not c.parallel.overlap.overlap_grad_reduce),
    "precision": ({"precision": "fp16"}, DENSE, ("auto", "megatron"),
                  lambda c: c.parallel.numerics.precision == "fp16"),
    # Knobs the search never varies are carried as given (they were once dropped).
    "capacity and graph scope": (
        {"moe_expert_capacity_factor": 1.5, "cuda_graphs": True, "cuda_graph_scope": ("attn",)},
        MOE, ("megatron",),
        lambda c: c.parallel.moe.moe_expert_capacity_factor == 1.5
        and c.parallel.execution.cuda_graph_scope == ("attn",)),
    "bucket size": ({"ddp_bucket_size": 10**7}, DENSE, ("auto", "megatron"),
                    lambda c: c.parallel.overlap.ddp_bucket_size == 10**7),
}
CASES = [(knob, space) for knob, (_, _, spaces, _) in KEPT.items() for space in spaces]


@pytest.mark.parametrize(("knob", "space"), CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_a_fixed_knob_is_kept_by_every_plan(knob: str, space: str) -> None:
    fixed, model, _, kept = KEPT[knob]
    ranked = search(model, CLUSTER, BATCH, fixed, space).ranked
    assert ranked, f"no plan honours {fixed}"
    broken = [c for c, _ in ranked if not kept(c)]
    assert not broken, broken[:3]


def test_the_auto_space_still_varies_stage_meshes_around_a_fixed_knob() -> None:
    """Fixing one knob does not collapse the auto space into the Megatron one: with the
    recomputation fixed, some plan's stages still differ in mesh or size."""
    ranked = search(DENSE, CLUSTER, BATCH, {"recompute": "full"}, "auto").ranked
    assert any(c.stages for c, _ in ranked) or any(
        len(set(c.layers_per_stage)) > 1 for c, _ in ranked
    )


def test_the_readme_example_keeps_tensor_parallelism_8(capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 200)
    code = cli.main(["gpt3-175b", "--cluster", "dgx-h100", "--gpus", "512",
                     "--global-batch-size", "1536", "--tensor-model-parallel-size", "8",
                     "--recompute-granularity", "full"])
    out = capsys.readouterr().out
    assert code == 0
    rows = re.findall(r"│ \d+ │ (.+?) │ (\w+)\s+│", out)
    assert len(rows) == 5
    for layout, recompute in rows:
        assert layout.startswith("t8 ") and recompute == "full", (layout, recompute)
    assert "--tensor-model-parallel-size 8 " in out
    assert "--recompute-granularity full" in out
