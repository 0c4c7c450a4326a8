"""`runtime.adapters` in one process (no ranks): LoRA's adapters on the zoo transformer
are the parameters the Plan lists, initialised as LoRA does (the first forward is the
base model's), the base frozen; and the runtime refuses what it does not run of
fine-tuning, in one line each."""

from __future__ import annotations

import pytest
import torch

from cost_models.finetuned_parameters import finetuned_chunk
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.vocabulary.parallel import Finetuning
from planner.vocabulary.parallel_dims import ParallelDims
from runtime.adapters import add_adapters, initial_adapter
from runtime.model_parts import ZooParts
from runtime.spec import RunSpec
from runtime.stages import build_reference, build_stage, init_parameter, materialize

LLAMA = TransformerConfig(**FAMILIES["llama"], num_layers=2, hidden_size=32,
                          num_attention_heads=4, num_query_groups=2, vocab_size=64,
                          seq_length=8)
LORA = Finetuning(finetune="lora", lora_rank=4, lora_alpha=8.0)


def _spec(**finetuning) -> RunSpec:
    return RunSpec(degrees=ParallelDims(pipeline=1, data=1, context=1, tensor=1),
                   chunks=((0, LLAMA.num_layers),), micro_batch_size=1, num_micro_batches=1,
                   finetuning=Finetuning(**finetuning))


def test_adapters_are_the_plans_parameters_and_start_as_the_base_model() -> None:
    tokens = torch.randint(0, LLAMA.vocab_size, (2, LLAMA.seq_length),
                           generator=torch.Generator().manual_seed(0))
    model = build_reference(LLAMA, seed=0)
    base = model(tokens)
    params = finetuned_chunk(LLAMA, (0, LLAMA.num_layers), True, True, LORA)
    add_adapters(model, params, LORA, seed=0)
    names = dict(model.named_parameters())
    assert set(names) == {p.name for p in params}
    trained = {n for n, p in names.items() if p.requires_grad}
    assert trained == {p.name for p in params if not p.frozen}
    assert "layers.1.mlp.down_proj.lora_b.weight" in trained
    assert names["layers.0.attn.q_proj.lora_a.weight"].shape == (4, 32)
    assert names["layers.0.attn.o_proj.lora_b.weight"].shape == (32, 4)
    # B zero, A kaiming-uniform: the first forward is the base model's, bit for bit.
    assert torch.equal(model(tokens), base)
    a = names["layers.0.mlp.gate_proj.lora_a.weight"]
    assert a.abs().max() <= 1 / 32 ** 0.5 and a.abs().max() > 0
    # A gradient reaches the adapters only.
    model(tokens).sum().backward()
    assert all((p.grad is not None) == (n in trained) for n, p in names.items())


def test_a_stage_on_the_meta_device_gets_the_same_adapters_as_one_process() -> None:
    """Every rank materializes its factors from the seed and the name alone."""
    spec = _spec(finetune="lora", lora_rank=4, lora_alpha=8.0)
    stage = build_stage(LLAMA, (1, 2), first_stage=False, last_stage=True)
    ZooParts(LLAMA).fine_tune(stage, spec, (1, 2), first=False, last=True)
    materialize(stage, seed=3)
    reference = build_reference(LLAMA, seed=3)
    ZooParts(LLAMA).fine_tune(reference, spec, (0, 2), True, True, seed=3)
    whole = dict(reference.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, whole[name]), name
        assert param.requires_grad == ("lora" in name)
    assert torch.equal(init_parameter("layers.1.attn.v_proj.lora_b.weight", (16, 4), 3),
                       torch.zeros(16, 4))
    assert initial_adapter("layers.1.attn.v_proj.weight", (16, 32), 3) is None


def test_pretraining_and_full_fine_tuning_add_nothing() -> None:
    model = build_reference(LLAMA, seed=0)
    before = dict(model.named_parameters())
    for finetune in ("none", "full"):
        ZooParts(LLAMA).fine_tune(model, _spec(finetune=finetune), (0, 2), True, True)
    assert dict(model.named_parameters()) == before
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(("config", "finetune", "reason"), [
    (LLAMA, "qlora", "QLoRA's 4-bit NF4 base"),
    (TransformerConfig(**FAMILIES["mixtral"], num_layers=2, hidden_size=32,
                       num_attention_heads=4, vocab_size=64, seq_length=8),
     "lora", "LoRA on a mixture of experts is not run yet"),
])
def test_what_the_runtime_does_not_fine_tune_is_refused(config, finetune, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        ZooParts(config).check(_spec(finetune=finetune))
    ZooParts(config).check(_spec())  # pre-training runs


def test_a_spec_refuses_lora_without_targets() -> None:
    with pytest.raises(ValueError, match="lora_targets must be among"):
        _spec(finetune="lora", lora_targets=())
