"""What Tessel's runtime saves for backward under LoRA, in closed form: autograd saves a
tensor only for a gradient it computes, so the frozen base keeps less than a trained one
(`cost_models.saved_activations.tessel_block`). tests/runtime/test_activation_counter.py
measures the same plans in one process, and tests/e2e/test_lora_plan_check.py on 4 ranks.

A tiny Llama, fp32 (e = 4 bytes), micro-batches of b = 2 sequences of s = 16 tokens
(n = 32), h = 64, 4 query heads of 16 over 2 key/value heads (repeated to 4), f = 256,
LoRA rank r = 4."""

from __future__ import annotations

import pytest

from cost_models.saved_activations import saved_per_layer, tessel_layer, tessel_stage
from planner.models.config import TransformerConfig
from planner.models.presets import FAMILIES
from planner.vocabulary.parallel import ParallelConfig

LLAMA = TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=4,
                          num_query_groups=2, vocab_size=256, seq_length=16,
                          **FAMILIES["llama"])
GPT = TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=4, vocab_size=256,
                        seq_length=16, **FAMILIES["gpt"])
E, B, S, H, F, R, V, D = 4, 2, 16, 64, 256, 4, 256, 16
N = B * S
ALL = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")

# One block's parts, t = 1. An RMSNorm whose input requires grad: the fp32 input and rstd,
# and the normalised input only for a trained scale.
NORM = 4 * N * H + 4 * N
SCALE = E * N * H
LINEAR_INPUT = E * N * H  # the norm's output, read by q, k, v (or by gate and up)
QKV = E * N * (H + 2 * H)  # q, and k and v repeated to 4 heads
SDPA_OUT, LSE = E * N * H, 4 * N * 4
ROTARY = 2 * E * S * D
MLP_ACT = 3 * E * N * F  # silu's input and output, up's output
DOWN_INPUT = E * N * F  # their product
ADAPTER = E * N * R  # one adapted linear's x A^T
HEAD_INPUT, LOSS = E * N * H, 4 * N * V + 8 * N + 4


def _par(finetune: str = "lora", targets: tuple[str, ...] = ALL, **knobs) -> ParallelConfig:
    return ParallelConfig.of(micro_batch_size=B, engine="tessel", precision="fp32",
                             finetune=finetune, lora_rank=R, lora_targets=targets, **knobs)


def _total(kinds: dict[str, float]) -> float:
    return sum(kinds.values())


def test_a_lora_block_keeps_the_adapters_inputs_and_not_the_frozen_scales() -> None:
    # Every linear's input is still kept, by its adapter's A; each adapter adds x A^T
    # (q, k, v, o, gate, up, down); the norms' frozen scales drop the normalised input.
    full = tessel_layer(LLAMA, _par("full"))
    lora = tessel_layer(LLAMA, _par())
    assert _total(full) == 2 * (NORM + SCALE) + 2 * LINEAR_INPUT + QKV + SDPA_OUT + LSE \
        + ROTARY + MLP_ACT + DOWN_INPUT
    assert lora == {"norms": 2 * NORM, "linear inputs": 2 * LINEAR_INPUT,
                    "attention": QKV + SDPA_OUT + LSE, "mlp": MLP_ACT + DOWN_INPUT,
                    "rotary": ROTARY, "adapters": 7 * ADAPTER}
    # The steady-state block is what the engine-wide model reads too.
    assert saved_per_layer(LLAMA, _par(), score_free=True) == lora


def test_the_first_stage_under_lora_saves_no_frozen_embedding_head_or_first_norm() -> None:
    # The frozen embedding keeps no token ids and hands the first block an input that
    # requires no grad: its first norm saves nothing; the final norm keeps no normalised
    # input and the frozen head not its input; the loss is unchanged.
    layers = 3
    block = 2 * NORM + 2 * LINEAR_INPUT + QKV + SDPA_OUT + LSE + ROTARY + MLP_ACT \
        + DOWN_INPUT + 7 * ADAPTER
    stage = tessel_stage(LLAMA, _par(), layers, True, True)
    assert stage["embedding"] == 0 and stage["head"] == NORM and stage["loss"] == LOSS
    # The first block without its first norm's; the final norm; the loss.
    assert _total(stage) == (layers * block - NORM) + NORM + LOSS
    # A later chunk's input requires grad (the pipeline receives it so): every block alike.
    later = tessel_stage(LLAMA, _par(), layers, False, False)
    assert _total(later) == layers * block
    # Against full fine-tuning: the token ids, the first norm, every norm's normalised
    # input (2 per block and the final one), the head's input; less the adapters' x A^T.
    full = tessel_stage(LLAMA, _par("full"), layers, True, True)
    assert _total(full) - _total(stage) == 8 * N + NORM + SCALE + (2 * layers) * SCALE \
        + HEAD_INPUT - layers * 7 * ADAPTER


def test_without_adapters_on_attention_the_first_blocks_attention_saves_nothing() -> None:
    # Adapters on the MLP alone: in the first block nothing before the MLP requires grad:
    # no norm statistics, no q, k, v or SDPA output, no rotary tables, no linear input of
    # q, k, v (frozen); the MLP keeps its input (gate's and up's A), the activation (their
    # outputs require grad) and down's input (its A).
    mlp = ("linear_fc1", "linear_fc2")
    first = tessel_layer(LLAMA, _par(targets=mlp), input_grad=False)
    assert first == {"norms": 0, "linear inputs": LINEAR_INPUT, "attention": 0,
                     "mlp": MLP_ACT + DOWN_INPUT, "rotary": 0, "adapters": 3 * ADAPTER}
    # Later blocks: attention's q, k, v, output and log-sum-exp (the input requires grad)
    # but o_proj, frozen and unadapted, keeps nothing of its own.
    later = tessel_layer(LLAMA, _par(targets=mlp))
    assert later["attention"] == QKV + SDPA_OUT + LSE and later["norms"] == 2 * NORM
    assert later["linear inputs"] == LINEAR_INPUT
    # Attention's output projection alone: its A keeps SDPA's output, and from there on
    # everything requires grad, but no frozen linear keeps its input.
    proj = tessel_layer(LLAMA, _par(targets=("linear_proj",)), input_grad=False)
    assert proj == {"norms": NORM, "linear inputs": 0, "attention": SDPA_OUT,
                    "mlp": MLP_ACT, "rotary": 0, "adapters": ADAPTER}


def test_selective_recomputation_keeps_no_q_k_v_that_need_no_grad() -> None:
    # The checkpointed core keeps its inputs only through what it saved; with q, k and v
    # requiring no grad it saves nothing, and they go when checkpoint returns. With
    # adapters on q, k and v they stay, as the checkpoint's inputs.
    proj = tessel_layer(LLAMA, _par(targets=("linear_proj",), recompute="selective"),
                        input_grad=False)
    assert proj["attention"] == SDPA_OUT
    qkv = tessel_layer(LLAMA, _par(targets=("linear_qkv",), recompute="selective"),
                       input_grad=False)
    assert qkv["attention"] == QKV  # no log-sum-exp; o_proj (frozen) keeps no output
    assert qkv["norms"] == NORM  # the MLP's norm: its input requires grad


def test_full_recomputation_keeps_each_blocks_input_whatever_it_requires() -> None:
    stage = tessel_stage(LLAMA, _par(recompute="full"), 3, True, True)
    assert stage == {"checkpointed inputs": 3 * E * N * H, "embedding": 0,
                     "head": NORM, "loss": LOSS}


@pytest.mark.parametrize("t, sp", [(1, False), (2, False), (2, True)])
def test_a_gpt_stage_under_lora_over_tensor_ranks(t: int, sp: bool) -> None:
    # LayerNorm's joint backward keeps its input, mean and rstd whatever its weights need;
    # the tied head and the learned positions are frozen: no ids, no head input. Each
    # adapter's x A^T is whole on every tensor rank (n x r), as is its linear's input.
    full = tessel_stage(GPT, _par("full", tensor=t, sequence_parallel=sp), 3, True, True)
    lora = tessel_stage(GPT, _par(tensor=t, sequence_parallel=sp), 3, True, True)
    shards = t if sp else 1
    first_norm = (E * N * H + 2 * E * N) / shards
    assert _total(full) - _total(lora) == pytest.approx(
        8 * (N + S) + first_norm + HEAD_INPUT - 3 * 6 * ADAPTER)
