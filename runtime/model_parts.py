"""The model-specific steps of training a plan, chosen once per run: build a stage,
tensor-parallelize it, set its recomputation, give it values, and build the single-process
reference. Everything else (pipeline schedule, FSDP2 data parallelism per block, optimizer,
counting) is the same for every model and lives in `runtime.pipeline_trainer`.

`ZooParts` runs the zoo transformer (`runtime.stages`); `HFParts` runs a Hugging Face
decoder's own transformers modules (`runtime.hf`, imported only then, as importing
transformers takes seconds). `model_parts` picks one.

What each runs of its model is stated once, as `Rule`s (`rules`): `check` refuses a plan
that breaks one (each rank, and `plan check` before any rank starts), and `needs` gives
the knobs the runtime runs one value of for the model, which `plan check` fixes before
it searches, so that it never picks a plan a rank would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from cost_models.finetuned_parameters import finetuned_chunk
from planner.models.config import TransformerConfig
from runtime.adapters import add_adapters
from runtime.parallelize import apply_recompute, apply_tensor_parallel
from runtime.spec import RunSpec, runtime_dispatcher
from runtime.experts import apply_expert_parallel
from runtime.stages import build_reference, build_stage, force_load_balancing, materialize


# A plan knob (`planner.vocabulary.knobs`) -> its value in a RunSpec, as the runtime runs it.
_SPEC_KNOBS: dict[str, Callable[[RunSpec], Any]] = {
    "tensor": lambda spec: spec.degrees.tp,
    "context": lambda spec: spec.degrees.cp,
    "expert": lambda spec: spec.expert,
    "sequence_parallel": lambda spec: spec.sequence_parallel,
    "moe_token_dispatcher": lambda spec: spec.expert_dispatcher,
}
# How the runtime runs a knob's value given to the planner (DeepEP's flex dispatcher: as
# all-to-all, `runtime.spec.runtime_dispatcher`).
_AS_RUN: dict[str, Callable[[Any], Any]] = {"moe_token_dispatcher": runtime_dispatcher}


@dataclass(frozen=True)
class Rule:
    """One limit of what the runtime trains of a model, and why (`reason`, a clause).

    It applies to the plans `when` names (None: every plan). With a `knob` (a plan knob's
    name, `planner.vocabulary.knobs`), the runtime runs only its `value` there, which the
    planner fixes before it searches; without one, it runs none of them (none at all,
    for a model it never runs)."""

    reason: str
    knob: str | None = None
    value: Any = None
    when: Callable[[RunSpec], bool] | None = None

    def broken_by(self, spec: RunSpec) -> bool:
        """Whether `spec` asks for what the rule says the runtime does not run."""
        if self.when is not None and not self.when(spec):
            return False
        return self.knob is None or _SPEC_KNOBS[self.knob](spec) != self.value

    def allows(self, value: Any) -> bool:
        """Whether the runtime runs this rule's knob at `value` (as given to the planner:
        the flex dispatcher runs as all-to-all)."""
        return _AS_RUN.get(self.knob or "", lambda v: v)(value) == self.value


def _only(knob: str, value: Any, reason: str,
          when: Callable[[RunSpec], bool] | None = None) -> Rule:
    return Rule(reason, knob=knob, value=value, when=when)


def _when(when: Callable[[RunSpec], bool], reason: str) -> Rule:
    return Rule(reason, when=when)


def _never(reason: str) -> Rule:
    return Rule(reason)


def _finetuning_rules(what: str | None) -> list[Rule]:
    """What the runtime runs of fine-tuning: LoRA on `what` is not run where given (a
    clause naming the model's part it does not adapt yet); QLoRA never."""
    rules = [_when(lambda spec: spec.finetuning.finetune == "qlora",
                   "QLoRA's 4-bit NF4 base (dequantized to bf16 for each matmul) is not run "
                   "by this runtime, which trains in fp32 to compare with one process; "
                   "check the same plan with --finetune lora")]
    if what is not None:
        rules.append(_when(lambda spec: spec.finetuning.adapters,
                           f"LoRA on {what} is not run yet"))
    return rules


class ZooParts:
    """The zoo transformer of `config` (`planner.models.transformer.Transformer`)."""

    def __init__(self, config: TransformerConfig) -> None:
        self.config = config

    def rules(self) -> list[Rule]:
        """What the runtime runs of this model (`Rule`), in the order refusals name them."""
        c, rules = self.config, []
        if c.qk_layernorm:
            rules.append(_only("tensor", 1, "QK layer norm under tensor parallelism (its "
                               "weight's gradient sums over the ranks' heads) is not run yet "
                               "on a zoo model"))
        if c.mtp_num_layers:
            rules.append(_only("sequence_parallel", False, "multi-token prediction with "
                               "sequence parallelism is not run yet"))
        if c.mtp_num_layers and c.position_embedding == "learned":
            rules.append(_never("multi-token prediction with learned positions is not run yet"))
        if c.beyond_zoo():
            rules.append(_never(f"{', '.join(c.beyond_zoo())} describe a Hugging Face "
                                "architecture the zoo transformer does not build; train it "
                                "from its hf: config"))
        unadapted = [what for what, present in (
            ("a mixture of experts", c.is_moe), ("multi-latent attention",
                                                  c.multi_latent_attention),
            ("multi-token prediction", c.mtp_num_layers > 0)) if present]
        return rules + _finetuning_rules(" or ".join(unadapted) or None)

    def check(self, spec: RunSpec) -> None:
        """Raise ValueError, naming every rule broken, if `spec` asks for what the runtime
        does not run of this model."""
        problems = [rule.reason for rule in self.rules() if rule.broken_by(spec)]
        if problems:
            raise ValueError("; ".join(problems) + ".")

    def needs(self) -> list[Rule]:
        """The knobs the runtime runs one value of for this model (rules with a `knob`),
        for the planner to fix before it searches; ValueError where no plan of the model
        runs."""
        never = [rule.reason for rule in self.rules()
                 if rule.knob is None and rule.when is None]
        if never:
            raise ValueError("; ".join(never) + ".")
        return [rule for rule in self.rules() if rule.knob is not None]

    def reduce_replicated_gradients(self, stages: list[nn.Module], tp_mesh: DeviceMesh) -> None:
        """Sum over `tp_mesh` the gradients of parameters replicated over the tensor ranks
        whose ranks each see part of the input (none here: the zoo's sequence-parallel
        norms are DTensors, whose gradients DTensor sums; its QK norms are not run under
        tensor parallelism)."""

    def build_stage(self, layers: tuple[int, int], first: bool, last: bool) -> nn.Module:
        """Layers [first, last) on the meta device, embeddings / head on the end stages."""
        return build_stage(self.config, layers, first_stage=first, last_stage=last)

    def tensor_parallel(self, stage: nn.Module, tp_mesh: DeviceMesh, sequence: bool) -> None:
        """Megatron's tensor (and sequence) parallel layout of `stage`."""
        apply_tensor_parallel(stage, tp_mesh, sequence)

    def recompute(self, stage: nn.Module, mode: str) -> None:
        """Full (every block) or selective (attention cores) recomputation."""
        apply_recompute(stage, mode)

    def fine_tune(self, module: nn.Module, spec: RunSpec, layers: tuple[int, int],
                  first: bool, last: bool, tp_mesh: DeviceMesh | None = None,
                  seed: int = 0) -> None:
        """Under LoRA: `module` (the stage of `layers`, with the embeddings if `first`
        and the head if `last`; or the whole model) frozen, with the adapters its Plan
        lists beside its linears (`runtime.adapters`); else nothing."""
        if spec.finetuning.adapters:
            params = finetuned_chunk(self.config, layers, first, last, spec.finetuning)
            add_adapters(module, params, spec.finetuning, tp_mesh, seed)

    def materialize(self, stage: nn.Module, seed: int) -> None:
        """Give the meta stage this rank's shards of the initial values."""
        materialize(stage, seed)

    def expert_parallel(self, stage: nn.Module, mesh: DeviceMesh, dispatcher: str) -> None:
        """This rank's experts of each MoE block, on `mesh`'s ``ep`` axis."""
        apply_expert_parallel(stage, mesh, dispatcher)

    def force_balance(self, stage: nn.Module) -> None:
        """Forced load balancing of the stage's routers."""
        force_load_balancing(stage)

    def reference(self, seed: int, force_balance: bool = False) -> nn.Module:
        """The whole model in one process with the same initial values."""
        return build_reference(self.config, seed, force_balance)

    def logits(self, reference: nn.Module, tokens: torch.Tensor,
               targets: torch.Tensor | None = None):
        """The reference's logits on `tokens` (with MTP layers and `targets`: logits and
        the MTP loss, what `runtime.pipeline_trainer.lm_loss` takes)."""
        if self.config.mtp_num_layers and targets is not None:
            return reference(tokens, mtp_targets=targets)
        return reference(tokens)


class HFParts(ZooParts):
    """A Hugging Face decoder (`runtime.hf.stages.SUPPORTED`) from its config's
    ``to_dict()``, rebuilt on every rank; `config` is its zoo shape
    (`to_transformer_config`), which sizes the pipeline's activations."""

    def __init__(self, config: TransformerConfig, hf_config: dict[str, Any]) -> None:
        from runtime.hf import experts, stages, tensor_parallel

        super().__init__(config)
        self.stages, self.experts, self.tp = stages, experts, tensor_parallel
        self.hf_config = stages.hf_config_from_dict(hf_config)
        shape = {
            "num_layers": self.hf_config.num_hidden_layers,
            "hidden_size": self.hf_config.hidden_size,
            "vocab_size": self.hf_config.vocab_size,
            "tie_embeddings": bool(self.hf_config.tie_word_embeddings),
        }
        wrong = {k: v for k, v in shape.items() if getattr(config, k) != v}
        if wrong:
            raise ValueError(f"the model shape differs from the Hugging Face config's: {wrong}")

    def rules(self) -> list[Rule]:
        model_type = self.hf_config.model_type
        moe = model_type in self.stages.MOE_FAMILIES
        rules = [_only("context", 1, "context parallelism runs on zoo models only, not on a "
                       "Hugging Face model yet"),
                 *_finetuning_rules("a Hugging Face model's own modules")]
        if moe:
            return rules + [
                # (Without expert parallelism no token is dispatched.)
                _only("moe_token_dispatcher", "alltoall", "a Hugging Face MoE model runs the "
                      "alltoall token dispatcher", when=lambda spec: spec.expert > 1),
                _when(lambda spec: spec.degrees.tp > 1 and spec.expert == 1,
                      f"tensor parallelism of a Hugging Face {model_type} runs with expert "
                      "parallelism (its experts split over the tensor ranks, dispatched "
                      "all-to-all); expert parallelism 1 is not run yet"),
            ]
        rules.append(_only("expert", 1, "expert parallelism runs on zoo models and on the "
                           "Hugging Face Mixtral, Qwen3-MoE and DeepSeek-V3 only"))
        fused, unsplit = self._tensor_layout
        if unsplit:
            rules.append(_only("tensor", 1, unsplit))
        elif fused:
            # FSDP2 would cut a rank's [q_t; k_t; v_t] into row chunks that straddle
            # q, k and v, which no DTensor placement states (and GPT-2's Conv1D,
            # split on its other dim, gathers back out of order).
            rules.append(_when(
                lambda spec: spec.degrees.tp > 1 and spec.zero_stage >= 1,
                f"a Hugging Face {model_type}'s fused {', '.join(fused)}, split per head "
                "under tensor parallelism, is not also ZeRO-sharded yet; run it with "
                "--zero-stage 0 or --tensor-model-parallel-size 1"))
        return rules

    @cached_property
    def _tensor_layout(self) -> tuple[list[str], str]:
        """A dense decoder layer's fused linears split per head or per half under tensor
        parallelism (`runtime.hf.layout.per_head_fusions`), and why tensor parallelism
        does not split the layer ('' where it does)."""
        from runtime.hf.layout import per_head_fusions

        try:
            return per_head_fusions(self.hf_config), ""
        except ValueError as error:
            return [], str(error).rstrip(".")

    def reduce_replicated_gradients(self, stages: list[nn.Module], tp_mesh: DeviceMesh) -> None:
        self.tp.reduce_head_norm_gradients(stages, tp_mesh)

    def expert_parallel(self, stage: nn.Module, mesh: DeviceMesh, dispatcher: str) -> None:
        self.experts.apply_hf_expert_parallel(stage, mesh, dispatcher)

    def force_balance(self, stage: nn.Module) -> None:
        self.experts.force_hf_routing(stage, self.config.seq_length)

    def build_stage(self, layers: tuple[int, int], first: bool, last: bool) -> nn.Module:
        return self.stages.build_hf_stage(self.hf_config, layers, first, last)

    def tensor_parallel(self, stage: nn.Module, tp_mesh: DeviceMesh, sequence: bool) -> None:
        self.tp.apply_hf_tensor_parallel(stage, tp_mesh, sequence)

    def recompute(self, stage: nn.Module, mode: str) -> None:
        self.stages.apply_hf_recompute(stage, mode)

    def materialize(self, stage: nn.Module, seed: int) -> None:
        self.stages.materialize_hf_stage(stage, seed)

    def reference(self, seed: int, force_balance: bool = False) -> nn.Module:
        model = self.stages.build_hf_reference(self.hf_config, seed)
        if force_balance:
            self.experts.force_hf_routing(model, self.config.seq_length)
        return model

    def logits(self, reference: nn.Module, tokens: torch.Tensor,
               targets: torch.Tensor | None = None) -> torch.Tensor:
        return self.stages.hf_logits(reference, tokens)


def model_parts(config: TransformerConfig, hf_config: dict[str, Any] | None = None) -> ZooParts:
    """The Hugging Face model of `hf_config` if given, else the zoo model of `config`."""
    return ZooParts(config) if hf_config is None else HFParts(config, hf_config)
