"""One rank's pipeline stages of a Hugging Face decoder (Llama family), built from the
real transformers modules on the meta device.

A stage (`HFStageModule`) holds decoder layers [first, last) as transformers' own
``LlamaDecoderLayer(config, layer_idx)`` under their full-model names
(``model.layers.3.self_attn.q_proj.weight``), the token embedding on the first chunk and
the final norm and LM head (``model.norm``, ``lm_head``) on the last, so names and values
are those of ``LlamaForCausalLM``; no rank ever builds the whole model. Values come from
`runtime.stages.init_parameter` (keyed by name), shard by shard, as for the zoo model.

Tensor and sequence parallelism use the Megatron layout the zoo Llama gets in
`runtime.parallelize.apply_tensor_parallel`, with the same torch styles on the same
projections, so the collectives are the same: q/k/v and gate/up column-parallel, o and
down row-parallel, one `PrepareModuleInput` at each block's attention and MLP input,
vocabulary-parallel embedding, column-parallel LM head with gathered logits and, under
sequence parallelism, `SequenceParallel` norms. HF's attention reshapes with ``-1`` and
its grouped-query ratio (``num_key_value_groups``) is the same on a head shard, so the
modules run on local heads unchanged. DeepSeek-V3's multi-latent attention and experts get
the zoo's layout of them (`_deepseek_v3_tensor_parallel`).

Attention is torch's SDPA through transformers' own ``sdpa_attention_forward``,
registered under `ATTENTION` so that selective recomputation can checkpoint just the
attention core; with no attention mask it runs causal (``is_causal``), as the reference
does.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint
from transformers import CONFIG_MAPPING, AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from planner.models.hf_shape import without_code_fields
from planner.models.transformer import forced_experts
from runtime.experts import alltoall_dispatch
from runtime.parallelize import SequenceScatter, apply_recompute
from runtime.stages import init_parameter, materialize, sum_gradient_over, tied_head

ATTENTION = "tessel_sdpa"
"""The attention implementation stages run: transformers' SDPA, optionally recomputed."""

# Decoder families whose modules are Llama's (names, layout, forward) and that were run
# here against the single-process model: Llama; Qwen3-MoE (Llama's layout with QK norms
# and transformers' fused-expert MoE blocks) and DeepSeek-V3 (multi-latent attention,
# dense layers first, shared and routed experts; no MTP in transformers), tensor- and
# sequence-parallel with expert parallelism (Qwen3-MoE's tensor parallelism is not run yet).
SUPPORTED = ("llama", "qwen3_moe", "deepseek_v3")
MOE_FAMILIES = ("qwen3_moe", "deepseek_v3")

_DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop")


def _attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention; under selective recomputation (the module's
    ``recompute_core``) only softmax(QK^T)V is checkpointed, as Megatron does."""
    if getattr(module, "recompute_core", False) and torch.is_grad_enabled():
        return checkpoint(
            sdpa_attention_forward, module, query, key, value, attention_mask,
            use_reentrant=False, **kwargs,
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTENTION, _attention)


def hf_config_from_dict(fields: dict[str, Any]) -> Any:
    """The transformers config of `fields` (a config's ``to_dict()``), rebuilt with the
    concrete config class of its model_type (never Auto* with remote code), set up for
    training here: no KV cache, `ATTENTION`, dropout off (every rank must compute what
    one process does)."""
    # Without the fields that point transformers at code outside its package or pick an
    # attention kernel (the planner's own filter).
    fields = without_code_fields(fields)
    model_type = fields.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(
            f"the runtime trains Hugging Face {', '.join(SUPPORTED)} decoders, not "
            f"model_type {model_type!r}"
        )
    config = CONFIG_MAPPING[model_type].from_dict(fields)
    config.use_cache = False
    config._attn_implementation = ATTENTION
    for name in _DROPOUTS:
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    return config


def _modeling(config: Any):
    """transformers' modeling module of the config's family (e.g. modeling_llama)."""
    return importlib.import_module(
        f"transformers.models.{config.model_type}.modeling_{config.model_type}"
    )


def _classes(config: Any) -> dict[str, type]:
    prefix = type(config).__name__.removesuffix("Config")  # LlamaConfig -> Llama
    module = _modeling(config)
    return {
        part: getattr(module, f"{prefix}{part}")
        for part in ("DecoderLayer", "RMSNorm", "RotaryEmbedding", "ForCausalLM")
    }


class _Trunk(nn.Module):
    """The ``model.`` part of a stage: what ``LlamaModel`` holds, limited to the stage."""


class HFStageModule(nn.Module):
    """Decoder layers [first, last) of a Hugging Face causal LM, plus ``model.embed_tokens``
    if `first_stage` and ``model.norm`` and ``lm_head`` if `last_stage`. Input: token ids
    (first stage) or hidden states; output: hidden states or logits (last stage).

    Every stage holds its own ``model.rotary_emb`` (buffers only) and computes the
    position embeddings of the whole sequence from it, as ``LlamaModel`` does once.
    With tied word embeddings a last stage that is not also the first holds its own copy
    of ``model.embed_tokens`` and uses its weight as the head (Megatron's way, as the zoo
    stages do); the trainer keeps the two copies equal.
    """

    def __init__(
        self, config: Any, layers: tuple[int, int], first_stage: bool, last_stage: bool,
    ) -> None:
        super().__init__()
        classes = _classes(config)
        self.hf_config = config
        self.layer_range = layers
        self.first_stage, self.last_stage = first_stage, last_stage
        self.tie_embeddings = bool(config.tie_word_embeddings)
        h = config.hidden_size
        self.model = _Trunk()
        if first_stage or (last_stage and self.tie_embeddings):
            self.model.embed_tokens = nn.Embedding(config.vocab_size, h, config.pad_token_id)
        # A ModuleDict keyed by the global layer index: full-model names, and per-block
        # FSDP and recomputation find the blocks as they do in the zoo stages.
        self.model.layers = nn.ModuleDict({
            str(i): classes["DecoderLayer"](config, i) for i in range(*layers)
        })
        if last_stage:
            self.model.norm = classes["RMSNorm"](h, eps=config.rms_norm_eps)
            if not self.tie_embeddings:
                self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.model.rotary_emb = classes["RotaryEmbedding"](config=config)
        # Set by tensor parallelism with sequence parallelism: the hidden states between
        # blocks are 1/tp of the sequence, and the embeddings are scattered to that.
        self.sequence_shards = 1
        self.scatter_sequence: nn.Module | None = None
        # Set by tensor parallelism: layout of the tied head's input.
        self.head_input_layout = None

    @property
    def layers(self) -> nn.ModuleDict:
        """The stage's decoder layers by global index (``model.layers``)."""
        return self.model.layers

    @property
    def embed(self) -> nn.Embedding | None:
        """The token embedding, where this stage holds one (what the trainer's tied-
        embedding gradient sum reads)."""
        return getattr(self.model, "embed_tokens", None)

    def reset_buffers(self) -> None:
        """Recompute the rotary tables (non-persistent buffers, which `to_empty` leaves
        uninitialized) from the config, and zero DeepSeek-V3's router biases."""
        fresh = type(self.model.rotary_emb)(config=self.hf_config)
        with torch.no_grad():
            for name, buffer in self.model.rotary_emb.named_buffers():
                buffer.copy_(fresh.get_buffer(name))
        zero_router_biases(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first_stage:
            length = x.shape[1]
            x = self.model.embed_tokens(x)
            if self.scatter_sequence is not None:
                x = self.scatter_sequence(x)
        else:
            length = x.shape[1] * self.sequence_shards
        positions = torch.arange(length, device=x.device).unsqueeze(0)
        # Attention runs on the whole sequence (gathered under sequence parallelism).
        position_embeddings = self.model.rotary_emb(x, positions)
        for layer in self.layers.values():
            x = layer(x, position_embeddings=position_embeddings)
        if not self.last_stage:
            return x
        x = self.model.norm(x)
        if self.tie_embeddings:
            return tied_head(x, self.model.embed_tokens.weight, self.head_input_layout)
        return self.lm_head(x)


def zero_router_biases(module: nn.Module) -> None:
    """DeepSeek-V3's routers keep a score-correction bias buffer (the aux-loss-free
    balancing's, zero at the start; transformers' _init_weights zeroes it), which
    `to_empty` leaves uninitialized."""
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()


def build_hf_stage(
    config: Any, layers: tuple[int, int], first_stage: bool, last_stage: bool,
) -> HFStageModule:
    """The stage on the meta device: no parameter memory."""
    with torch.device("meta"):
        return HFStageModule(config, layers, first_stage, last_stage)


def materialize_hf_stage(stage: HFStageModule, seed: int) -> None:
    """`runtime.stages.materialize` (each rank's shards of every parameter), then the
    rotary buffers."""
    materialize(stage, seed)
    stage.reset_buffers()


def apply_hf_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """Megatron's tensor (and sequence) parallel layout of `stage` on `tp_mesh`, style for
    style that of `runtime.parallelize.apply_tensor_parallel` on the zoo Llama."""
    tp = tp_mesh.size()
    if tp == 1:
        return
    config = stage.hf_config
    if config.model_type == "deepseek_v3":
        _deepseek_v3_tensor_parallel(stage, tp_mesh, sequence_parallel)
        return
    if config.num_attention_heads % tp or config.num_key_value_heads % tp:
        raise ValueError(
            f"tensor parallelism {tp} must divide the {config.num_attention_heads} heads "
            f"and {config.num_key_value_heads} key/value heads"
        )
    seq = Shard(1) if sequence_parallel else Replicate()
    if stage.embed is not None:
        parallelize_module(stage.model, tp_mesh, {
            "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        })
        if sequence_parallel and stage.first_stage:
            stage.scatter_sequence = SequenceScatter(tp_mesh)
    if sequence_parallel:
        stage.sequence_shards = tp
    for block in stage.layers.values():
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
            # One replicated DTensor for q/k/v (gate/up) to read, so their input gradients
            # are reduced once, as Megatron's fused QKV and FC1. The decoder layer passes
            # the attention input by keyword, the MLP input by position.
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": seq},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        }
        if sequence_parallel:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)
    _ends_tensor_parallel(stage, tp_mesh, sequence_parallel)


def _ends_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool, embedding: bool = False,
) -> None:
    """The last stage's head (column-parallel, logits gathered) and final norm; with
    `embedding`, the vocabulary-parallel token embedding too."""
    seq = Shard(1) if sequence_parallel else Replicate()
    if embedding and stage.embed is not None:
        parallelize_module(stage.model, tp_mesh, {
            "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        })
        if sequence_parallel and stage.first_stage:
            stage.scatter_sequence = SequenceScatter(tp_mesh)
    if sequence_parallel:
        stage.sequence_shards = tp_mesh.size()
    if stage.last_stage:
        if stage.tie_embeddings:
            stage.head_input_layout = seq
        else:
            parallelize_module(stage, tp_mesh, {
                "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
            })
        if sequence_parallel:
            parallelize_module(stage.model, tp_mesh, {"norm": SequenceParallel()})


def _deepseek_v3_tensor_parallel(
    stage: HFStageModule, tp_mesh: DeviceMesh, sequence_parallel: bool,
) -> None:
    """DeepSeek-V3's Megatron-Core layout, read off transformers' modules as the zoo's
    `runtime.parallelize._block_tensor_parallel` lays out its MLA and MoE blocks:

    - multi-latent attention: the down projections to the latents (``q_a_proj``,
      ``kv_a_proj_with_mqa``) and the latents' norms replicated; the up projections
      (``q_b_proj``, or ``q_proj`` without a query latent, and ``kv_b_proj``) column-
      parallel by heads, their inputs' gradients reduced by ColwiseParallel; ``o_proj``
      row-parallel. The shared rotary key, which every head reads, is held whole: its
      gradient sums over the tensor ranks (one all-reduce in backward). transformers'
      attention reshapes with ``-1`` heads, so it runs on the local heads unchanged.
    - the dense MLP as Llama's (gate/up column-, down row-parallel, one input reduction);
    - the MoE block: the shared expert column- then row-parallel with its output reduced,
      every routed expert split over the tensor ranks the same way
      (`HFExpertParallelMoE.tensor_parallel`), the router replicated.
    """
    tp = tp_mesh.size()
    seq = Shard(1) if sequence_parallel else Replicate()
    config = stage.hf_config
    if config.num_attention_heads % tp:
        raise ValueError(f"tensor parallelism {tp} must divide the "
                         f"{config.num_attention_heads} heads")
    for block in stage.layers.values():
        attn = block.self_attn
        q_up = "self_attn.q_proj" if attn.q_proj is not None else "self_attn.q_b_proj"
        plan = {q_up: ColwiseParallel(), "self_attn.kv_b_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(output_layouts=seq)}
        mlp = block.mlp
        if isinstance(mlp, HFExpertParallelMoE):
            mlp.tensor_parallel()
            plan.update(_mlp_plan("mlp.shared_experts.", Replicate(), reduce_input=False))
        elif hasattr(mlp, "experts"):
            raise ValueError("tensor parallelism of a Hugging Face MoE model runs with "
                             "expert parallelism (--expert-model-parallel-size > 1)")
        else:
            plan.update(_mlp_plan("mlp.", seq, reduce_input=True))
        if sequence_parallel:
            # The sequence shards gathered for attention (its input's gradient is whole:
            # the latents' are reduced, so backward only slices it) and for the MoE block
            # (its output cut back to shards: backward all-gathers), as the zoo's MLA and
            # MoE blocks under sequence parallelism.
            plan["self_attn"] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": seq},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                use_local_output=True)
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
            if isinstance(mlp, HFExpertParallelMoE):
                plan["mlp"] = PrepareModuleInputOutput(
                    input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                    use_local_input=True, output_layouts=(Replicate(),),
                    desired_output_layouts=(seq,), use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
        rope = config.qk_rope_head_dim
        attn.kv_a_proj_with_mqa.register_forward_hook(
            lambda module, args, out, rope=rope: _rotary_key_gradient_summed(out, rope, tp_mesh))
    _ends_tensor_parallel(stage, tp_mesh, sequence_parallel, embedding=True)


def _mlp_plan(prefix: str, seq, reduce_input: bool) -> dict[str, Any]:
    """A gated MLP's layout: gate/up column-, down row-parallel with its output reduced
    (to sequence shards `seq`); with `reduce_input`, gate and up read one replicated input
    gathered from `seq` (one gradient reduction, as Megatron's fused FC1), else each
    reduces its own (the zoo's experts)."""
    plan: dict[str, Any] = {prefix + "gate_proj": ColwiseParallel(),
                            prefix + "up_proj": ColwiseParallel(),
                            prefix + "down_proj": RowwiseParallel(output_layouts=seq)}
    if reduce_input:
        plan[prefix.rstrip(".")] = PrepareModuleInput(input_layouts=(seq,),
                                                      desired_input_layouts=(Replicate(),))
    return plan


def _rotary_key_gradient_summed(out: torch.Tensor, rope: int, tp_mesh: DeviceMesh):
    """``kv_a_proj_with_mqa``'s output (latent, rotary key) with the rotary key's gradient
    summed over `tp_mesh` (the latent's is reduced by ``kv_b_proj``'s ColwiseParallel)."""
    latent, key = out.split([out.shape[-1] - rope, rope], dim=-1)
    return torch.cat([latent, sum_gradient_over(tp_mesh)(key)], dim=-1)


def apply_hf_recompute(stage: HFStageModule, recompute: str) -> None:
    """Full: checkpoint every decoder layer; selective: only each attention core."""
    if recompute == "selective":
        for block in stage.layers.values():
            block.self_attn.recompute_core = True
    else:
        apply_recompute(stage, recompute)


def build_hf_reference(config: Any, seed: int) -> nn.Module:
    """The whole model (transformers' ``LlamaForCausalLM``) in one process with the values
    the stages get, under its own parameter names; `hf_logits` calls it."""
    with torch.device("meta"):
        model = _classes(config)["ForCausalLM"](config)
    model.to_empty(device="cpu")
    if config.tie_word_embeddings:  # after to_empty, which gives each name its own tensor
        model.lm_head.weight = model.model.embed_tokens.weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(init_parameter(name, param.shape, seed))
        fresh = type(model.model.rotary_emb)(config=config)
        for name, buffer in model.model.rotary_emb.named_buffers():
            buffer.copy_(fresh.get_buffer(name))
    zero_router_biases(model)
    model.train()
    return model


def hf_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of a transformers causal LM on `tokens` (no cache, no mask: causal)."""
    return model(tokens, use_cache=False).logits


def _routers(module: nn.Module) -> list[nn.Module]:
    """transformers' top-k routers of fused-expert MoE blocks (``mlp.gate``)."""
    return [m for m in module.modules() if type(m).__name__.lower().endswith("topkrouter")]


def force_hf_routing(module: nn.Module, seq_length: int) -> None:
    """Forced load balancing of every router in `module` (the zoo's rule,
    `planner.models.transformer.forced_experts`, over positions of `seq_length`-token
    sequences): the experts fixed, weighted by the router's softmax probabilities of them,
    renormalized where the config says (``norm_topk_prob``)."""
    for router in _routers(module):
        router.forward = types.MethodType(_forced_forward, router)
        router.seq_length = seq_length


def _forced_forward(self, hidden_states: torch.Tensor):
    """The router's scores (softmax; DeepSeek-V3's sigmoid, normalized and scaled as its
    router does) of the forced experts."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    sigmoid = hasattr(self, "routed_scaling_factor")  # DeepseekV3TopkRouter
    if sigmoid:
        logits = F.linear(hidden_states.float(), self.weight.float())
        probs = logits.sigmoid()
    else:
        logits = F.linear(hidden_states, self.weight)
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    tokens = hidden_states.shape[0]
    index = forced_experts(tokens // self.seq_length, self.seq_length, self.top_k,
                           self.num_experts, logits.device).reshape(tokens, self.top_k)
    top = probs.gather(-1, index)
    if sigmoid:
        if self.norm_topk_prob:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, top * self.routed_scaling_factor, index
    if self.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), index


class HFExpertParallelMoE(nn.Module):
    """This rank's experts of a transformers fused-expert MoE block (``mlp.experts.
    gate_up_proj`` ``[E, 2f, h]``, ``down_proj`` ``[E, h, f]``, each a DTensor split over
    the expert-parallel ranks on dim 0, under their full names) with its replicated
    router (``mlp.gate``), dispatched all-to-all (`runtime.experts.alltoall_dispatch`).

    Under tensor parallelism (`tensor_parallel`: Megatron's default expert tensor degree,
    the tensor degree) every expert is split as a dense MLP is: ``gate_up_proj`` on its
    output dim with the gate and up halves split alike (each rank holds the same rows of
    both: `_StridedShard` with split factor 2), ``down_proj`` on its input dim. An expert
    reduces its output over the tensor ranks, and its gate's and its up's input gradients
    each on their own, as the zoo's experts (separate gate and up projections) do."""

    def __init__(self, moe: nn.Module, mesh: DeviceMesh) -> None:
        super().__init__()
        self.gate, self.experts = moe.gate, moe.experts
        self.shared_experts = getattr(moe, "shared_experts", None)  # DeepSeek-V3's
        self.num_experts = moe.experts.num_experts
        ep_mesh = mesh["ep"]
        self.mesh = mesh
        self.tp_mesh: DeviceMesh | None = None
        self.ep, self.ep_group = ep_mesh.size(), ep_mesh.get_group()
        if self.num_experts % self.ep:
            raise ValueError(f"expert parallelism {self.ep} must divide the "
                             f"{self.num_experts} experts")
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(self.experts, name)
            setattr(self.experts, name,
                    nn.Parameter(distribute_tensor(param, ep_mesh, [Shard(0)])))

    def tensor_parallel(self) -> None:
        """Split every expert over the tensor ranks (before `materialize`: on meta)."""
        mesh = self.mesh["ep", "tp"]
        tp = mesh.size(1)
        f = self.experts.gate_up_proj.shape[1] // 2
        if f % tp:
            raise ValueError(f"tensor parallelism {tp} must divide the experts' "
                             f"intermediate size {f}")
        layouts = {"gate_up_proj": [Shard(0), _StridedShard(1, split_factor=2)],
                   "down_proj": [Shard(0), Shard(2)]}
        for name, placements in layouts.items():
            whole = torch.empty(getattr(self.experts, name).shape, device="meta")
            setattr(self.experts, name, nn.Parameter(distribute_tensor(
                whole, mesh, placements, src_data_rank=None)))
        self.tp_mesh = self.mesh["tp"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        _, top, index = self.gate(x.reshape(-1, h))
        gate_up = self.experts.gate_up_proj.to_local()
        down = self.experts.down_proj.to_local()
        act = self.experts.act_fn
        tp_mesh = self.tp_mesh

        def run(local: int, rows: torch.Tensor) -> torch.Tensor:
            if tp_mesh is None:
                gate, up = F.linear(rows, gate_up[local]).chunk(2, dim=-1)
                return F.linear(act(gate) * up, down[local])
            gate_w, up_w = gate_up[local].chunk(2, dim=0)
            reduced = sum_gradient_over(tp_mesh)
            gate = F.linear(reduced(rows), gate_w)
            up = F.linear(reduced(rows), up_w)
            partial = F.linear(act(gate) * up, down[local])
            return DTensor.from_local(partial, tp_mesh, [Partial()], run_check=False
                                      ).redistribute(tp_mesh, [Replicate()]).to_local()

        out = alltoall_dispatch(x, top.reshape(b, s, -1), index.reshape(b, s, -1),
                                self.num_experts, self.ep, self.ep_group, run)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


def apply_hf_expert_parallel(stage: HFStageModule, mesh: DeviceMesh, dispatcher: str) -> None:
    """Each MoE block's experts split over the ``ep`` axis of `mesh`
    (`runtime.experts.expert_mesh`), tokens dispatched all-to-all."""
    if dispatcher != "alltoall":
        raise ValueError("a Hugging Face MoE model runs the alltoall token dispatcher "
                         "(--moe-token-dispatcher-type alltoall)")
    for block in stage.layers.values():
        if hasattr(block.mlp, "experts"):
            block.mlp = HFExpertParallelMoE(block.mlp, mesh)
