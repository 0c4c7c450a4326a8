"""The TorchTitan 0.3 config functions Tessel knows by name, and the models they build.

`plan predict --torchtitan llama3_8b` names a function of a model's config registry
(`--module llama3 --config llama3_8b` on TorchTitan's command line). Tessel has no
TorchTitan source at run time, so `CONFIGS` holds what each function sets, copied from
torchtitan 0.3.0 (the PyPI wheel; `SOURCE`) and written as `next_job` reads any config:
0.3's dotted keys (`next_keys`), the checkpointing policy under "activation_checkpoint",
the loss's class under "loss", and the `model_registry(...)` call under "model.*".
Fields a function leaves at their default are absent: `Trainer.Config`'s defaults apply.

`MODELS` maps a registry's (module, flavor) to Tessel's model of the same shape
(tests hold each to the wheel's model_registry values where the wheel is at hand).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.torchtitan.next_keys import SOURCE


@dataclass(frozen=True)
class Registered:
    """One config function of TorchTitan's registries."""

    source: str
    """Where it is defined: the file of the wheel and the function."""
    settings: dict[str, Any]
    """What it sets, by 0.3 dotted key (see the module docstring)."""


def _llama3(flavor: str, **settings: Any) -> dict[str, Any]:
    # Every Llama 3 baseline of torchtitan/models/llama3/config_registry.py shares these:
    # the chunked cross-entropy loss, AdamW, the c4 dataset and checkpoints every 500 steps.
    return {"model.module": "llama3", "model.flavor": flavor, "loss": "ChunkedLossWrapper",
            "optimizer.name": "AdamW", "dataloader.dataset": "c4",
            "checkpoint.interval": 500, "validator.freq": 500, "validator.steps": 1200,
            "profiler.enable_profiling": True, "profiler.profile_freq": 100,
            "metrics.enable_tensorboard": True, **settings}


_LLAMA3 = "torchtitan/models/llama3/config_registry.py"
_DEEPSEEK = "torchtitan/models/deepseek_v3/config_registry.py"
_QWEN3 = "torchtitan/models/qwen3/config_registry.py"

CONFIGS: dict[str, Registered] = {
    "llama3_8b": Registered(f"{SOURCE} {_LLAMA3}: llama3_8b", _llama3(
        "8B", **{"hf_assets_path": "./assets/hf/Llama-3.1-8B", "optimizer.lr": 3e-4,
                 "training.local_batch_size": 1, "training.seq_len": 8192,
                 "training.steps": 1000, "activation_checkpoint": "selective"})),
    "llama3_70b": Registered(f"{SOURCE} {_LLAMA3}: llama3_70b", _llama3(
        "70B", **{"hf_assets_path": "./assets/hf/Llama-3.1-70B", "optimizer.lr": 1.5e-4,
                  "training.local_batch_size": 8, "training.seq_len": 8192,
                  "training.steps": 1000, "parallelism.tensor_parallel_degree": 8,
                  "activation_checkpoint": "full"})),
    "llama3_405b": Registered(f"{SOURCE} {_LLAMA3}: llama3_405b", _llama3(
        "405B", **{"hf_assets_path": "./assets/hf/Llama-3.1-405B", "optimizer.lr": 8e-5,
                   "lr_scheduler.warmup_steps": 600, "training.local_batch_size": 2,
                   "training.seq_len": 8192, "training.steps": 3000,
                   "parallelism.tensor_parallel_degree": 8, "activation_checkpoint": "full",
                   "compile.enable": True, "compile.enable_async_tensor_parallel": True,
                   "model.converters": [("Float8LinearConverter",
                                         {"filter_fqns": ["lm_head"],
                                          "model_compile_enabled": True})]})),
    "deepseek_v3_16b": Registered(f"{SOURCE} {_DEEPSEEK}: deepseek_v3_16b", {
        "model.module": "deepseek_v3", "model.flavor": "16B", "model.attn_backend": "flex",
        "loss": "ChunkedLossWrapper", "hf_assets_path": "./assets/hf/deepseek-moe-16b-base",
        "dataloader.dataset": "c4", "optimizer.name": "AdamW", "optimizer.lr": 2.2e-4,
        "lr_scheduler.decay_ratio": 0.8, "lr_scheduler.decay_type": "cosine",
        "lr_scheduler.min_lr_factor": 0.1, "training.local_batch_size": 4,
        "training.seq_len": 4096, "training.steps": 1000,
        "training.disable_cuda_graphs": True,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.expert_parallel_degree": 8, "checkpoint.interval": 10,
        "activation_checkpoint": "selective", "compile.enable": True,
        "compile.components": ["loss"]}),
    "deepseek_v3_671b": Registered(f"{SOURCE} {_DEEPSEEK}: deepseek_v3_671b", {
        "model.module": "deepseek_v3", "model.flavor": "671B", "model.attn_backend": "flex",
        "loss": "ChunkedLossWrapper", "hf_assets_path": "./assets/hf/DeepSeek-V3.1-Base",
        "dataloader.dataset": "c4", "optimizer.name": "AdamW", "optimizer.lr": 2.2e-4,
        "lr_scheduler.warmup_steps": 2000, "lr_scheduler.decay_ratio": 0.8,
        "lr_scheduler.decay_type": "cosine", "lr_scheduler.min_lr_factor": 0.1,
        "training.local_batch_size": 4, "training.seq_len": 4096, "training.steps": 10000,
        "training.disable_cuda_graphs": True,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.expert_parallel_degree": 2, "checkpoint.interval": 500,
        "activation_checkpoint": "selective", "compile.enable": True,
        "compile.components": ["loss"]}),
    "qwen3_30b_a3b": Registered(f"{SOURCE} {_QWEN3}: qwen3_30b_a3b", {
        "model.module": "qwen3", "model.flavor": "30B-A3B", "loss": "ChunkedLossWrapper",
        "hf_assets_path": "./assets/hf/Qwen3-30B-A3B", "dataloader.dataset": "c4",
        "optimizer.name": "AdamW", "optimizer.lr": 8e-4, "lr_scheduler.warmup_steps": 600,
        "training.local_batch_size": 2, "training.seq_len": 4096, "training.steps": 3000,
        "parallelism.data_parallel_shard_degree": -1,
        "parallelism.tensor_parallel_degree": 1, "parallelism.context_parallel_degree": 1,
        "parallelism.pipeline_parallel_degree": 1, "checkpoint.interval": 500,
        "checkpoint.last_save_model_only": False, "checkpoint.export_dtype": "float16",
        "activation_checkpoint": "full"}),
}

# (module, flavor) -> (the zoo preset of that shape, the shape fields that differ from it).
# torchtitan/models/<module>/__init__.py of the wheel: llama3_configs, deepseekv3_configs,
# qwen3's _30b_a3b.
MODELS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("llama3", "8B"): ("llama3-8b", {}),
    ("llama3", "70B"): ("llama3-70b", {}),
    ("llama3", "405B"): ("llama3-405b", {}),
    # model_registry's num_mtp_layers defaults to 0: no multi-token prediction layer.
    ("deepseek_v3", "671B"): ("deepseek-v3", {"mtp_num_layers": 0}),
    # _16b: DeepSeek-MoE 16B's shape with MLA (no query compression), 64 experts of
    # width 1408 with two shared ones, top-6 softmax routing, the first layer dense.
    ("deepseek_v3", "16B"): ("deepseek-v3", {
        "num_layers": 27, "hidden_size": 2048, "num_attention_heads": 16,
        "ffn_hidden_size": 10944, "vocab_size": 102400, "q_lora_rank": None,
        "kv_lora_rank": 512, "num_experts": 64, "moe_top_k": 6, "moe_ffn_hidden_size": 1408,
        "moe_shared_expert_intermediate_size": 2 * 1408, "moe_layer_freq": [0] + [1] * 26,
        "moe_router_score_function": "softmax", "moe_router_num_groups": None,
        "moe_router_group_topk": None, "mtp_num_layers": 0, "max_position_embeddings": 16384}),
    ("qwen3", "30B-A3B"): ("qwen3-30b-a3b", {}),
}
# The names Tessel gives the models of `MODELS` in its plans.
MODEL_NAMES = {("deepseek_v3", "16B"): "deepseek-v3-16b"}


def model_name(module: str, flavor: str) -> str:
    """The plan's name of a registry model: its zoo preset, or its own name."""
    return MODEL_NAMES.get((module, flavor), MODELS[(module, flavor)][0])
