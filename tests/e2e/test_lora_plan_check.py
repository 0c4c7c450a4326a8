"""LoRA plans of a tiny Llama trained for real on 4 gloo ranks, as `plan check` does, against
one process: tp2 x dp2 and pp2 x dp2 (with ZeRO-0, 2 and 3, sequence parallelism, and
adapters on the MLP alone), and cp2 x dp2, in one launch of the ranks. Each trains as one
process does (losses within 1e-4, the adapters too), leaves every base weight as it was
initialised, bit for bit, changes every adapter, and every rank issues exactly the
collectives the Plan predicts, kind by kind in count and bytes, holds exactly the parameters,
gradients and optimizer state it predicts, and saves for backward in each micro-batch
exactly the bytes it predicts (the frozen base's linears, embedding, head and norm scales
keep what only their weights' gradients would read; the adapters keep their inputs).
Then `plan check --finetune lora` itself, the way a user gets there."""

from __future__ import annotations

import json

import pytest
import torch

from planner.checks.training_check import compare, merge_results, relative_errors, train_reference
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.models.transformer import lm_loss
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from runtime.adapters import initial_adapter
from runtime.elastic import launch
from runtime.spec import from_training_plan
from runtime.stages import build_reference
from runtime.training_loop import batches

# Llama's form (RMSNorm, SwiGLU, RoPE, untied head), grouped-query attention.
LLAMA = TransformerConfig(**FAMILIES["llama"], num_layers=4, hidden_size=64,
                          num_attention_heads=4, num_query_groups=2, vocab_size=256,
                          seq_length=16)
GPUS, STEPS, SEED = 4, 3, 0
# name -> the plan's knobs (data 2, global batch 8 in micro-batches of 2, rank 4)
LAYOUTS = {
    "tp2-dp2-zero2": dict(tensor=2, pipeline=1, zero_stage=2),
    "tp2-dp2-zero3-sp-mlp": dict(tensor=2, pipeline=1, zero_stage=3, sequence_parallel=True,
                                 lora_targets=("linear_fc1", "linear_fc2")),
    "pp2-dp2-zero2": dict(tensor=1, pipeline=2, zero_stage=2),
    "pp2-dp2-zero0-gpipe": dict(tensor=1, pipeline=2, zero_stage=0, schedule="gpipe"),
    # Context parallelism, only attention's output adapted: the first layer's keys and
    # values get no gradient, so their reduce-scatters are not issued.
    "cp2-dp2-zero3-proj": dict(tensor=1, pipeline=1, context=2, zero_stage=3,
                               lora_targets=("linear_proj",)),
}


def _plan(knobs: dict):
    parallel = ParallelConfig.of(**{
        "data": 2, "global_batch_size": 8, "micro_batch_size": 2, "precision": "fp32",
        "engine": "tessel", "finetune": "lora", "lora_rank": 4, "lora_alpha": 8.0, **knobs})
    return training_plan("llama-tiny", LLAMA, Cluster.load("cpu").with_devices(GPUS),
                         parallel)


def _full_plan(name: str):
    """Layout `name` fully fine-tuned: every weight trained."""
    return _plan({**LAYOUTS[name], "finetune": "full"})


def _train_each(rank: int, world: int, specs: list) -> list[dict]:
    from runtime.training_loop import train_on_rank

    return [train_on_rank(rank, world, LLAMA, spec, STEPS, SEED, "adamw") for spec in specs]


def _relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    names = sorted(want)
    difference = torch.cat([(got[n] - want[n]).flatten() for n in names])
    return float(difference.norm() / torch.cat([want[n].flatten() for n in names]).norm())


@pytest.mark.timeout(300)
def test_lora_plans_train_as_one_process_and_as_predicted() -> None:
    plans = {name: _plan(knobs) for name, knobs in LAYOUTS.items()}
    specs = {name: from_training_plan(plan) for name, plan in plans.items()}
    assert all(spec.finetuning.finetune == "lora" and spec.finetuning.lora_rank == 4
               for spec in specs.values())
    results = launch(_train_each, GPUS, list(specs.values()))
    initial = dict(build_reference(LLAMA, SEED).named_parameters())
    tokens, targets = batches(LLAMA, specs["pp2-dp2-zero2"], 1, SEED)[0]
    with torch.no_grad():
        base_loss = float(lm_loss(build_reference(LLAMA, SEED)(tokens), targets))
    for index, (name, plan) in enumerate(plans.items()):
        ranks = [r[index] for r in results]
        losses, params = merge_results(ranks)
        ref_losses, ref_params = train_reference(LLAMA, specs[name], STEPS, SEED, "adamw")
        loss_err, param_err = relative_errors(losses, params, ref_losses, ref_params)
        assert loss_err < 1e-4 and param_err < 1e-4, (name, losses, ref_losses)
        # B starts at zero: the first step's loss is the base model's.
        assert abs(losses[0] - base_loss) < 1e-5 * base_loss, name
        adapters = {n for n in ref_params if ".lora_" in n}
        assert adapters and set(params) == set(initial) | adapters
        # The adapters on their own (the base's norm would hide them).
        assert _relative(params, {n: ref_params[n] for n in adapters}) < 1e-4, name
        for n in initial:  # the base, bit for bit as initialised
            assert torch.equal(params[n], initial[n]), (name, n)
        for n in adapters:  # every factor trained (A from its second step on)
            assert not torch.equal(params[n], initial_adapter(n, params[n].shape, SEED)), \
                (name, n)
        comparison = compare(plan, [r["coords"] for r in ranks],
                             [r["collectives"] for r in ranks],
                             [r["local_bytes"] for r in ranks], STEPS,
                             [r["saved_activations"] for r in ranks])
        assert comparison.passed, (name, comparison.mismatches)
        assert comparison.measured == comparison.predicted, name
        rows = comparison.memory
        assert len(rows) == 3 * GPUS and not any(row.note for row in rows), name
        assert all(row.measured == row.predicted for row in rows), (name, rows)
        # What each micro-batch of each chunk saves for backward, byte for byte: 2 per
        # rank (global batch 8 over data 2, micro-batches of 2).
        saved = comparison.activations
        assert len(saved) == 2 * GPUS and not any(row.note for row in saved), name
        assert all(row.measured == row.predicted for row in saved), (name, saved)
        # The frozen base saves less than full fine-tuning would (no embedding indices,
        # head input or normalised inputs of the norms' scales).
        full_saved = _full_plan(name).stages
        assert all(row.predicted < full_saved[row.stage].saved_activation_bytes[0]
                   for row in saved), name
        # The frozen base has neither gradients nor optimizer state: a rank holds the
        # adapters' only, a small share of what full fine-tuning would hold.
        full = _full_plan(name)
        for row in rows:
            if row.kind != "parameters":
                held = full.stages[ranks[row.rank]["coords"]["pp"]].memory
                assert row.measured < 0.15 * getattr(held, f"{row.kind}_bytes"), (name, row)


@pytest.mark.timeout(300)
def test_plan_check_fine_tunes_with_lora(tmp_path, capsys) -> None:
    """`plan check llama ... --finetune lora` under tp2 x dp2: the plan's flags reach the
    runtime, which trains it as one process does and as the Plan predicts, what it saves
    for backward included."""
    from planner import cli

    report = tmp_path / "check.json"
    code = cli.main([
        "check", "llama", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--num-query-groups", "2", "--vocab-size", "256",
        "--seq-length", "16", "--gpus", "4", "--global-batch-size", "8",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
        "--zero-stage", "2", "--finetune", "lora", "--lora-rank", "4", "--steps", "2",
        "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out, out
    data = json.loads(report.read_text())
    plan, check = data["plan"], data["details"]["check"]
    comparison = data["details"]["comparison"]
    assert plan["run"]["finetune"] == "lora" and plan["run"]["lora_rank"] == 4
    assert (plan["parallel"]["tensor"], plan["parallel"]["data"]) == (2, 2)
    assert "layers.0.attn.q_proj.lora_a.weight" in plan["stages"][0]["parameters"]
    assert check["loss_max_rel_error"] < 1e-4 and check["parameter_rel_error"] < 1e-4
    assert comparison["passed"] and comparison["measured"] == comparison["predicted"]
    assert all(row["measured"] == row["predicted"] and not row["note"]
               for row in comparison["memory"])
    saved = comparison["activations"]
    assert saved and all(row["measured"] == row["predicted"] and not row["note"]
                         for row in saved)
