"""MaxText's config of a Plan (`plan --emit maxtext`): the ici_*/dcn_* degrees split at the
plan's scale-up domain (a TPU slice, a GPU node), the per-device batch, the remat policy and
precision, each key one of MaxText's base.yml; and the one-line refusals of what MaxText
cannot run. Plans are predicted as given (no search), except the command-line ones."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from planner import cli
from planner.export.engines import Refusal, engine_files
from planner.export.maxtext import CONFIG_FILE, LAUNCH_FILE, maxtext_files
from planner.models.presets import zoo_config
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan
from tests.planner.export.preset_plans import FULL, plan_of

AXES = ("data", "fsdp", "fsdp_transpose", "context", "tensor", "tensor_sequence", "expert",
        "pipeline")
def config_of(plan: Plan) -> dict:
    """The emitted maxtext.yml, read back."""
    files = engine_files("maxtext", plan, plan.architecture)
    assert set(files) == {CONFIG_FILE, LAUNCH_FILE}
    return yaml.safe_load(files[CONFIG_FILE])


def mesh(config: dict, kind: str) -> dict[str, int]:
    """{axis: degree} of the config's ici or dcn keys that are not 1."""
    return {axis: config[f"{kind}_{axis}_parallelism"] for axis in AXES
            if config[f"{kind}_{axis}_parallelism"] != 1}


def refusal(plan: Plan) -> str:
    with pytest.raises(Refusal) as raised:
        engine_files("maxtext", plan, plan.architecture)
    line = str(raised.value)
    assert "\n" not in line and line.startswith("MaxText cannot run this plan: "), line
    return line.removeprefix("MaxText cannot run this plan: ")


def test_zero3_on_two_h100_nodes_is_fsdp_within_and_across_nodes() -> None:
    """Checks every key and value of a ZeRO-3 plan of 16 GPUs (2 nodes of 8): FSDP 8 over
    ICI and 2 over DCN, one sequence per device, 4 accumulation steps, full remat."""
    plan = plan_of("llama3-8b", "dgx-h100", 16, zero_stage=3, global_batch_size=64, **FULL)
    assert plan.num_micro_batches == 4
    ones = {f"{kind}_{axis}_parallelism": 1 for kind in ("ici", "dcn") for axis in AXES}
    expected = {"base_config": "base.yml", "hardware": "gpu", "model_name": "llama3-8b",
                **ones, "ici_fsdp_parallelism": 8, "dcn_fsdp_parallelism": 2,
                "shard_optimizer_over_data": False, "per_device_batch_size": 1,
                "gradient_accumulation_steps": 4, "max_target_length": 8192,
                "remat_policy": "full", "dtype": "bfloat16", "weight_dtype": "float32",
                "grad_dtype": "float32"}
    assert config_of(plan) == expected


def test_tensor_sequence_parallel_zero1_splits_data_at_the_node() -> None:
    """Checks: TP 4 with sequence parallelism is tensor_sequence inside the node, the data
    degree 4 is 2 inside and 2 across nodes, ZeRO-1 shards the optimizer over data, and a
    forward's batch (2 x 4 sequences) is 0.5 per device, accumulated 8 times."""
    plan = plan_of("llama3-8b", "dgx-h100", 16, tensor=4, sequence_parallel=True, zero_stage=1,
                   micro_batch_size=2, global_batch_size=64, recompute="selective")
    config = config_of(plan)
    assert mesh(config, "ici") == {"data": 2, "tensor_sequence": 4}
    assert mesh(config, "dcn") == {"data": 2}
    assert config["shard_optimizer_over_data"] is True
    assert (config["per_device_batch_size"], config["gradient_accumulation_steps"]) == (0.5, 8)
    assert config["remat_policy"] == "minimal"  # the attention core rematerialized
    # MaxText's own batch rule: global = per device x devices x accumulation steps.
    assert config["per_device_batch_size"] * 16 * config["gradient_accumulation_steps"] == 64


@pytest.mark.parametrize(("model", "cluster_name", "devices", "knobs"), [
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 3, "global_batch_size": 64, **FULL}),
    ("llama3-70b", "dgx-h100", 32, {"tensor": 8, "pipeline": 2, "schedule": "gpipe",
                                    "sequence_parallel": True, "zero_stage": 1,
                                    "global_batch_size": 64, **FULL}),
    ("mixtral-8x7b", "dgx-h100", 64, {"tensor": 2, "expert": 4, "sequence_parallel": True,
                                      "zero_stage": 1, "global_batch_size": 256, **FULL}),
    ("llama3-8b", "tpu-v6e", 512, {"zero_stage": 3, "global_batch_size": 512, **FULL}),
    ("llama3-70b", "tpu-v7", 64, {"tensor": 4, "zero_stage": 1, "global_batch_size": 64,
                                  **FULL}),
])
def test_degrees_multiply_to_the_devices_split_at_the_slice(
        model: str, cluster_name: str, devices: int, knobs: dict) -> None:
    """Checks: the ICI degrees multiply to a slice's (node's) JAX devices and the DCN ones
    to the slices; each axis's ici x dcn is the plan's degree (in JAX devices)."""
    plan = plan_of(model, cluster_name, devices, **knobs)
    config = config_of(plan)
    per_chip = 2 if cluster_name == "tpu-v7" else 1
    per_slice = min(plan.devices_per_node, plan.num_gpus)
    assert math.prod(mesh(config, "ici").values()) == per_slice * per_chip
    assert math.prod(mesh(config, "dcn").values()) == plan.num_gpus // per_slice
    q = plan.parallel
    degree = {axis: config[f"ici_{axis}_parallelism"] * config[f"dcn_{axis}_parallelism"]
              for axis in AXES}
    assert degree["pipeline"] == q.pipeline and degree["expert"] == q.expert
    assert degree["context"] == q.context
    assert degree["tensor"] * degree["tensor_sequence"] * degree["data"] * degree["fsdp"] \
        == q.tensor * q.data // q.expert * per_chip


def test_gpipe_pipeline_is_maxtexts_and_1f1b_is_refused() -> None:
    """Checks: a GPipe plan of 2 equal stages writes the stage layers, one repeat and the
    plan's 32 micro-batches (one batch of 64 split by the pipeline: 2 per device, no
    accumulation), pipeline over DCN; the same plan under 1F1B is refused in one line."""
    knobs = {"tensor": 8, "pipeline": 2, "sequence_parallel": True, "zero_stage": 1,
             "global_batch_size": 64, **FULL}
    config = config_of(plan_of("llama3-70b", "dgx-h100", 32, schedule="gpipe", **knobs))
    assert {key: config[key] for key in (
        "num_layers_per_pipeline_stage", "num_pipeline_repeats", "num_pipeline_microbatches",
        "scan_layers", "per_device_batch_size", "gradient_accumulation_steps")} == {
        "num_layers_per_pipeline_stage": 40, "num_pipeline_repeats": 1,
        "num_pipeline_microbatches": 32, "scan_layers": False, "per_device_batch_size": 2,
        "gradient_accumulation_steps": 1}
    assert mesh(config, "dcn") == {"data": 2, "pipeline": 2}
    assert refusal(plan_of("llama3-70b", "dgx-h100", 32, schedule="1f1b", **knobs)) == (
        "MaxText's pipeline runs every micro-batch's forward before the backwards (GPipe's "
        "order), not 1f1b: plan with --schedule gpipe")


def test_ironwood_chip_is_two_jax_devices() -> None:
    """Checks: on TPU7x a ZeRO-3 plan of 64 chips is FSDP over 128 JAX devices with half
    the per-chip batch per device; a ZeRO-1 plan puts the factor on the tensor axis."""
    fsdp = config_of(plan_of("llama3-8b", "tpu-v7", 64, zero_stage=3, micro_batch_size=2,
                             global_batch_size=256, recompute="full"))
    assert (fsdp["hardware"], mesh(fsdp, "ici"), mesh(fsdp, "dcn")) == ("tpu", {"fsdp": 128}, {})
    assert (fsdp["per_device_batch_size"], fsdp["gradient_accumulation_steps"]) == (1, 2)
    tensor = config_of(plan_of("llama3-70b", "tpu-v7", 64, tensor=4, zero_stage=1,
                               global_batch_size=64, **FULL))
    assert mesh(tensor, "ici") == {"data": 16, "tensor": 8}
    assert tensor["per_device_batch_size"] == 0.125


@pytest.mark.parametrize(("recompute", "modules", "policy"), [
    ("none", ("core_attn",), "minimal_with_context"),
    ("selective", ("core_attn",), "minimal"),
    ("selective", ("mlp",), "save_dot_with_context_except_mlp"),
    ("selective", ("core_attn", "mlp", "layernorm"), "save_dot_except_mlp"),
    ("full", ("core_attn",), "full"),
])
def test_remat_policy_is_the_nearest_maxtext_policy(recompute: str, modules: tuple,
                                                    policy: str) -> None:
    """Checks the recomputation knob's MaxText remat_policy (decoders.py's list)."""
    plan = plan_of("llama3-8b", "dgx-h100", 8, zero_stage=3, micro_batch_size=1,
                   global_batch_size=8, recompute=recompute, recompute_modules=modules)
    assert config_of(plan)["remat_policy"] == policy


def test_a_shape_of_no_maxtext_model_is_written_as_base_keys() -> None:
    """Checks: a Llama-style shape that is none of MaxText's model configs gets base.yml's
    shape keys and the llama2 decoder block; a GPT-style one the gpt3 block."""
    shape = zoo_config("llama3-8b", {"num_layers": 4, "hidden_size": 1024,
                                     "num_attention_heads": 8})
    plan = training_plan("small", shape, Cluster.load("dgx-h100").with_devices(8),
                         ParallelConfig.of(zero_stage=3, global_batch_size=8, **FULL))
    config = yaml.safe_load(maxtext_files(plan, shape)[CONFIG_FILE])
    assert "model_name" not in config
    assert {key: config[key] for key in ("decoder_block", "base_emb_dim",
                                         "base_num_query_heads", "base_num_kv_heads",
                                         "base_num_decoder_layers", "mlp_activations")} == {
        "decoder_block": "llama2", "base_emb_dim": 1024, "base_num_query_heads": 8,
        "base_num_kv_heads": 8, "base_num_decoder_layers": 4,
        "mlp_activations": ["silu", "linear"]}
    gpt = config_of(plan_of("gpt3-1.3b", "dgx-h100", 8, micro_batch_size=4,
                            global_batch_size=64, recompute="selective"))
    assert (gpt["decoder_block"], gpt["trainable_position_size"]) == ("gpt3", 2048)


@pytest.mark.parametrize(("model", "cluster_name", "devices", "knobs", "line"), [
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 2, "global_batch_size": 64, **FULL},
     "MaxText shards over data ranks the optimizer's state (ZeRO-1, "
     "shard_optimizer_over_data) or everything (FSDP, ZeRO-3), not gradients apart: plan "
     "with --zero-stage 1 or 3"),
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 1, "precision": "fp16",
                                   "global_batch_size": 64, **FULL},
     "MaxText has no fp16 training as priced (no loss scaling): plan with --precision bf16"),
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 1, "global_batch_size": 64,
                                   "recompute_method": "block", "recompute_num_layers": 4,
                                   **FULL},
     "MaxText rematerializes every layer by one policy, not Megatron-LM's "
     "--recompute-method / --recompute-num-layers groups"),
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 1, "global_batch_size": 64,
                                   "finetune": "lora", **FULL},
     "lora adapters are not written for MaxText: use --emit pytorch"),
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 3, "global_batch_size": 64,
                                   "offload_optimizer": "cpu", **FULL},
     "MaxText has no --offload-optimizer (run.offload_optimizer = 'cpu')"),
    ("llama3-8b", "trn1", 32, {"zero_stage": 1, "global_batch_size": 64, **FULL},
     "MaxText runs on TPUs and GPUs, and this plan was priced on trn1: use --emit neuronx"),
    ("llama3-8b", "dgx-h100", 24, {"tensor": 4, "pipeline": 2, "schedule": "gpipe",
                                   "zero_stage": 1, "global_batch_size": 6, **FULL},
     "its data degree 3 straddles the scale-up domain of 8 devices unevenly"),
    ("llama3-70b", "tpu-v7", 64, {"tensor": 4, "zero_stage": 1, "micro_batch_size": 1,
                                  "global_batch_size": 64, "recompute": "full",
                                  "pipeline": 2, "schedule": "gpipe"},
     None),  # accepted: a GPipe pipeline on TPU7x
])
def test_what_maxtext_cannot_run_is_refused_in_one_line(
        model: str, cluster_name: str, devices: int, knobs: dict, line: str | None) -> None:
    """Checks each refusal's one line (and that a plan it can run is written)."""
    plan = plan_of(model, cluster_name, devices, **knobs)
    if line is None:
        assert config_of(plan)["num_pipeline_microbatches"] == plan.num_micro_batches
    else:
        assert refusal(plan) == line


def test_cli_emit_maxtext_on_two_h100_nodes(tmp_path: Path, capsys) -> None:
    """Checks: `plan ... --emit maxtext DIR` on 2 DGX H100 nodes writes maxtext.yml and an
    executable maxtext.sh; the degrees split at the node and multiply to 16 GPUs."""
    out = tmp_path / "out"
    argv = ["llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--global-batch-size", "64",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--context-parallel-size", "1", "--micro-batch-size", "1", "--zero-stage", "3",
            "--recompute-granularity", "full", "--emit", "maxtext", str(out)]
    assert cli.main(argv) == 0
    assert f"maxtext: wrote {out / CONFIG_FILE}, {out / LAUNCH_FILE}" in capsys.readouterr().out
    config = yaml.safe_load((out / CONFIG_FILE).read_text())
    assert (mesh(config, "ici"), mesh(config, "dcn")) == ({"fsdp": 8}, {"fsdp": 2})
    script = (out / LAUNCH_FILE).read_text()
    assert (out / LAUNCH_FILE).stat().st_mode & 0o111
    assert "python3 -m maxtext.trainers.pre_train.train maxtext.yml" in script


def test_cli_emit_maxtext_on_two_tpu_v5p_slices(tmp_path: Path, capsys) -> None:
    """Checks: Llama 3 8B on two v5p slices (2 x 6,144 chips) gets data parallelism over
    DCN (the slices) and FSDP over ICI, one sequence per chip."""
    out = tmp_path / "out"
    argv = ["llama3-8b", "--cluster", "tpu-v5p", "--gpus", "12288",
            "--global-batch-size", "12288", "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1",
            "--micro-batch-size", "1", "--zero-stage", "3", "--recompute-granularity", "full",
            "--emit", "maxtext", str(out)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    config = yaml.safe_load((out / CONFIG_FILE).read_text())
    assert config["hardware"] == "tpu"
    assert (mesh(config, "ici"), mesh(config, "dcn")) == ({"fsdp": 6144}, {"fsdp": 2})
    assert (config["per_device_batch_size"], config["gradient_accumulation_steps"]) == (1, 1)
