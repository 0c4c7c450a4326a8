"""The model-specific steps of training a plan, chosen once per run: build a stage,
tensor-parallelize it, set its recomputation, give it values, and build the single-process
reference. Everything else (pipeline schedule, FSDP2 data parallelism per block, optimizer,
counting) is the same for every model and lives in `runtime.pipeline_trainer`.

`ZooParts` runs the zoo transformer (`runtime.stages`); `HFParts` runs a Hugging Face
decoder's own transformers modules (`runtime.hf`, imported only then, as importing
transformers takes seconds). `model_parts` picks one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from planner.models.config import TransformerConfig
from runtime.parallelize import apply_recompute, apply_tensor_parallel
from runtime.spec import RunSpec
from runtime.experts import apply_expert_parallel
from runtime.stages import build_reference, build_stage, force_load_balancing, materialize


class ZooParts:
    """The zoo transformer of `config` (`planner.models.transformer.Transformer`)."""

    def __init__(self, config: TransformerConfig) -> None:
        self.config = config

    def check(self, spec: RunSpec) -> None:
        """Raise ValueError if `spec` asks for what this model cannot run."""
        c, problems = self.config, []
        if c.qk_layernorm and spec.degrees.tp > 1:
            problems.append("QK layer norm under tensor parallelism (its weight's gradient "
                            "sums over the ranks' heads) is not run yet")
        if c.mtp_num_layers and spec.sequence_parallel:
            problems.append("multi-token prediction with sequence parallelism is not run yet")
        if c.mtp_num_layers and c.position_embedding == "learned":
            problems.append("multi-token prediction with learned positions is not run yet")
        if c.beyond_zoo():
            problems.append(f"{', '.join(c.beyond_zoo())} describe a Hugging Face "
                            "architecture the zoo transformer does not build; train it from "
                            "its hf: config")
        if problems:
            raise ValueError("; ".join(problems) + ".")

    def build_stage(self, layers: tuple[int, int], first: bool, last: bool) -> nn.Module:
        """Layers [first, last) on the meta device, embeddings / head on the end stages."""
        return build_stage(self.config, layers, first_stage=first, last_stage=last)

    def tensor_parallel(self, stage: nn.Module, tp_mesh: DeviceMesh, sequence: bool) -> None:
        """Megatron's tensor (and sequence) parallel layout of `stage`."""
        apply_tensor_parallel(stage, tp_mesh, sequence)

    def recompute(self, stage: nn.Module, mode: str) -> None:
        """Full (every block) or selective (attention cores) recomputation."""
        apply_recompute(stage, mode)

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

    def check(self, spec: RunSpec) -> None:
        model_type = self.hf_config.model_type
        moe = model_type in self.stages.MOE_FAMILIES
        if spec.degrees.cp > 1 or (spec.expert > 1 and not moe):
            raise ValueError(
                "context parallelism, and expert parallelism of other than Mixtral, "
                "Qwen3-MoE and DeepSeek-V3, run on zoo models only, not on a Hugging Face "
                "model yet"
            )
        tp = spec.degrees.tp > 1
        if tp and model_type in ("qwen3", "qwen3_moe"):
            raise ValueError(f"tensor parallelism of a Hugging Face {model_type} (its QK "
                             "norms' gradients sum over the ranks' heads) is not run yet")
        if tp and model_type == "mixtral":
            raise ValueError("tensor parallelism of a Hugging Face mixtral (its fused experts "
                             "split over the tensor ranks) is not run yet; run it with "
                             "--tensor-model-parallel-size 1")
        if tp and moe and spec.expert == 1:
            raise ValueError("tensor parallelism of a Hugging Face DeepSeek-V3 runs with "
                             "expert parallelism (its experts split over the tensor ranks, "
                             "dispatched all-to-all); expert parallelism 1 is not run yet")
        if tp and moe and spec.expert_dispatcher != "alltoall":
            raise ValueError("a Hugging Face MoE model runs the alltoall token dispatcher")
        if tp and not moe and spec.zero_stage >= 1:
            from runtime.hf.layout import per_head_fusions

            fused = per_head_fusions(self.hf_config)
            if fused:
                # FSDP2 would cut a rank's [q_t; k_t; v_t] into row chunks that straddle
                # q, k and v, which no DTensor placement states (and GPT-2's Conv1D,
                # split on its other dim, gathers back out of order).
                raise ValueError(
                    f"a Hugging Face {model_type}'s fused {', '.join(fused)}, split per head "
                    "under tensor parallelism, is not also ZeRO-sharded yet; run it with "
                    "--zero-stage 0 or --tensor-model-parallel-size 1")

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
