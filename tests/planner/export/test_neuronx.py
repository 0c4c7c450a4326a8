"""NeuronX Distributed Training's config of a Plan (`plan --emit neuronx`): the degrees in
NeuronCores (2 per Trainium1 chip, 4 logical per Trainium2 chip at LNC=2), the plan's
pipeline cuts, micro and global batch, recomputation and precision as NxDT's Hydra config
keys, a torchrun line torch's own parser reads, and the one-line refusals. Plans are
predicted as given (no search), except the command-line one."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from torch.distributed.run import get_args_parser

from planner import cli
from planner.export.engines import Refusal, engine_files
from planner.export.neuronx import CONFIG_FILE, LAUNCH_FILE
from planner.vocabulary.plan import Plan
from tests.planner.export.preset_plans import FULL, plan_of

def files_of(plan: Plan) -> tuple[dict, str]:
    """(the emitted neuronx.yaml read back, neuronx.sh)."""
    files = engine_files("neuronx", plan, plan.architecture)
    assert set(files) == {CONFIG_FILE, LAUNCH_FILE}
    return yaml.safe_load(files[CONFIG_FILE]), files[LAUNCH_FILE]


def torchrun_args(script: str):
    """torchrun's own parser on the script's launch line, its variables filled in."""
    line = next(line for line in script.splitlines() if line.startswith("torchrun "))
    for name, value in {"NODE_RANK": "0", "MASTER_ADDR": "node0",
                        "MODEL_CONFIG": "config.json"}.items():
        line = line.replace(f"${name}", value)
    return get_args_parser().parse_args(shlex.split(line)[1:])


def test_llama3_8b_on_two_trn1_instances() -> None:
    """Checks every key and value of TP 8 (chips) x DP 4 on 32 Trainium1 chips: TP 16
    NeuronCores, 32 ranks per instance on 2 instances, 16 micro-batches of 1 derived by NxD
    from the batch keys, selective recomputation of CoreAttention, ZeRO-1 mixed precision."""
    plan = plan_of("llama3-8b", "trn1", 32, tensor=8, sequence_parallel=True, zero_stage=1,
                   global_batch_size=64, micro_batch_size=1, recompute="selective")
    config, script = files_of(plan)
    assert config == {
        "defaults": ["hf_llama3_8B_config", "_self_"],
        "trainer": {"devices": 32, "num_nodes": 2},
        "distributed_strategy": {
            "tensor_model_parallel_size": 16, "pipeline_model_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": 1, "context_parallel_size": 1,
            "expert_model_parallel_size": 1, "zero1": True, "sequence_parallel": True,
            "kv_replicator": 2},
        "data": {"micro_batch_size": 1, "global_batch_size": 64},
        "model": {"encoder_seq_length": 8192, "max_position_embeddings": 8192,
                  "num_layers": 32, "hidden_size": 4096, "rope_theta": 500000.0,
                  "activations_checkpoint_granularity": "selective",
                  "activations_checkpoint_recompute": ["CoreAttention"]},
        "precision": {"type": "mixed_precision"},
    }
    # NxD's own rule (lightning_modules/model/base.py): data = world / (TP x PP x CP),
    # micro-batches = global / (micro x data): the plan's.
    strategy = config["distributed_strategy"]
    world = config["trainer"]["devices"] * config["trainer"]["num_nodes"]
    data = world // (strategy["tensor_model_parallel_size"]
                     * strategy["pipeline_model_parallel_size"]
                     * strategy["context_parallel_size"])
    assert data == plan.parallel.data
    assert 64 // (1 * data) == plan.num_micro_batches
    args = torchrun_args(script)
    assert (int(args.nproc_per_node), args.nnodes, args.training_script) == (
        32, "2", "training_orchestrator.py")
    assert args.training_script_args == ["--config-path=conf", "--config-name=neuronx",
                                         "model.model_config=config.json"]


def test_llama3_70b_on_trn2_runs_the_plans_stages_at_lnc2() -> None:
    """Checks: on 64 Trainium2 chips (4 instances) TP 8 chips is TP 32 logical cores, 64
    ranks per instance with lnc 2, and the plan's 4 stages are its pipeline cuts."""
    plan = plan_of("llama3-70b", "trn2", 64, tensor=8, pipeline=4, sequence_parallel=True,
                   zero_stage=1, global_batch_size=64, **FULL)
    config, script = files_of(plan)
    assert config["defaults"] == ["hf_llama3_8B_trn2_config", "_self_"]
    assert config["trainer"] == {"devices": 64, "num_nodes": 4, "lnc": 2}
    strategy = config["distributed_strategy"]
    assert (strategy["tensor_model_parallel_size"], strategy["pipeline_model_parallel_size"],
            strategy["kv_replicator"]) == (32, 4, 4)
    cuts = [f"model.layers.{stage.layers[0]}" for stage in plan.stages[1:]]
    assert config["model"]["pipeline_cuts"] == cuts == ["model.layers.20", "model.layers.40",
                                                        "model.layers.60"]
    assert config["model"]["activations_checkpoint_granularity"] == "full"
    assert int(torchrun_args(script).nproc_per_node) == 64


def test_mixtral_experts_are_carved_from_the_data_ranks() -> None:
    """Checks: Mixtral 8x7B with 2 expert ranks over 4 data ranks writes the expert degree,
    the Mixtral example config, and dropless routing (the plan caps no expert)."""
    plan = plan_of("mixtral-8x7b", "trn1", 64, tensor=8, expert=2, sequence_parallel=True,
                   zero_stage=1, global_batch_size=64, micro_batch_size=1,
                   recompute="selective", recompute_modules=("core_attn", "layernorm"))
    config, _ = files_of(plan)
    assert config["defaults"] == ["hf_mixtral_8x7b_config", "_self_"]
    assert config["distributed_strategy"]["expert_model_parallel_size"] == 2
    assert config["model"]["moe"] == {"num_experts": 8, "top_k": 2, "capacity_factor": None,
                                      "dropless": True}
    assert config["model"]["activations_checkpoint_recompute"] == ["CoreAttention",
                                                                   "MixtralRMSNorm"]


def test_no_tensor_parallelism_splits_each_chip_with_sequence_parallelism() -> None:
    """Checks: a data-parallel plan still splits each Trainium1 chip's layers over its two
    cores (TP 2 with sequence parallelism); no recomputation is null."""
    plan = plan_of("llama3-8b", "trn1", 16, zero_stage=1, global_batch_size=64,
                   micro_batch_size=1, recompute="none")
    config, _ = files_of(plan)
    strategy = config["distributed_strategy"]
    assert (strategy["tensor_model_parallel_size"], strategy["sequence_parallel"]) == (2, True)
    assert config["model"]["activations_checkpoint_granularity"] is None


@pytest.mark.parametrize(("model", "cluster_name", "devices", "knobs", "line"), [
    ("llama3-8b", "dgx-h100", 16, {"zero_stage": 1, "global_batch_size": 64, **FULL},
     "it runs on Trainium, and this plan was priced on dgx-h100: plan with --cluster trn1 "
     "or trn2"),
    ("llama3-8b", "trn1", 32, {"zero_stage": 3, "global_batch_size": 64, **FULL},
     "it shards the optimizer's state (zero1), not gradients or weights as ZeRO-3 does: "
     "plan with --zero-stage 1"),
    ("llama3-8b", "trn1", 32, {"zero_stage": 0, "global_batch_size": 64, **FULL},
     "it keeps fp32 master weights only with its ZeRO-1 optimizer (zero1): plan with "
     "--zero-stage 1"),
    ("llama3-70b", "trn2", 64, {"tensor": 8, "pipeline": 4, "schedule": "gpipe",
                                "zero_stage": 1, "global_batch_size": 64, **FULL},
     "its pipeline runs 1F1B (interleaved with virtual stages), not gpipe: plan with "
     "--schedule 1f1b"),
    ("gpt3-1.3b", "trn1", 16, {"zero_stage": 1, "global_batch_size": 64, **FULL},
     "its Hugging Face models are Llama and Mixtral; gpt3-1.3b's shape is neither"),
    ("llama3-8b", "trn1", 32, {"zero_stage": 1, "global_batch_size": 64,
                               "finetune": "lora", **FULL},
     "lora adapters are not written for it: use --emit pytorch"),
    ("mixtral-8x7b", "trn1", 64, {"tensor": 8, "expert": 2, "zero_stage": 1,
                                  "global_batch_size": 64, "micro_batch_size": 1,
                                  "recompute": "selective", "recompute_modules": ("mlp",)},
     "its mixtral model has no module to recompute for mlp"),
])
def test_what_nxd_cannot_run_is_refused_in_one_line(
        model: str, cluster_name: str, devices: int, knobs: dict, line: str) -> None:
    """Checks each refusal's one line."""
    plan = plan_of(model, cluster_name, devices, **knobs)
    with pytest.raises(Refusal) as raised:
        engine_files("neuronx", plan, plan.architecture)
    assert str(raised.value) == f"NeuronX Distributed cannot run this plan: {line}"


def test_cli_emit_neuronx_on_trn1(tmp_path: Path, capsys) -> None:
    """Checks: `plan ... --cluster trn1 --emit neuronx DIR` writes neuronx.yaml and an
    executable neuronx.sh whose degrees multiply to the plan's NeuronCores."""
    out = tmp_path / "out"
    argv = ["llama3-8b", "--cluster", "trn1", "--gpus", "32", "--global-batch-size", "64",
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1",
            "--context-parallel-size", "1", "--micro-batch-size", "1", "--zero-stage", "1",
            "--recompute-granularity", "full", "--emit", "neuronx", str(out)]
    assert cli.main(argv) == 0
    assert f"neuronx: wrote {out / CONFIG_FILE}, {out / LAUNCH_FILE}" in capsys.readouterr().out
    config = yaml.safe_load((out / CONFIG_FILE).read_text())
    strategy = config["distributed_strategy"]
    assert config["trainer"]["devices"] * config["trainer"]["num_nodes"] == 64
    assert strategy["tensor_model_parallel_size"] == 16
    assert (out / LAUNCH_FILE).stat().st_mode & 0o111
