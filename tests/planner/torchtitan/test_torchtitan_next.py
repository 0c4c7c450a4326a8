"""planner.torchtitan, TorchTitan 0.3's form: a registry config by name, a config module
read with ast, the command line's overrides.

- Tessel's table of registry configs is what TorchTitan 0.3.0's own config_registry.py
  functions set, read from the wheel's source where its environment is at hand.
- The llama3 8B / 70B and DeepSeek-V3 16B / 671B registry configs predict what `plan`'s
  predictor gives their degrees, batch, sequence and model shape (written out here);
  llama3_405b's row-wise float8 is read as torchao's rowwise recipe.
- A config module's literals, derived functions and attribute assignments are read; a
  non-literal is refused naming the file, line and construct; a bad override, an
  unknown name, one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli
from planner.models.presets import get_preset, zoo_config
from planner.plans.transformer_plan import training_plan
from planner.torchtitan import JobConfigError
from planner.torchtitan.config_module import read_config_module
from planner.torchtitan.next_job import load_job
from planner.torchtitan.registry import CONFIGS
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = "dgx-h100"
# What Tessel reads of a config: the rest changes neither time nor memory.
READ = ("training.", "parallelism.", "compile.", "activation_checkpoint", "model.")


def titan(**knobs) -> ParallelConfig:
    zero = knobs.setdefault("zero_stage", 3)
    knobs.setdefault("sequence_parallel", knobs.get("tensor", 1) > 1)
    knobs.setdefault("fp8_recipe", "tensorwise")
    return ParallelConfig.of(engine="torchtitan", overlap_grad_reduce=True,
                             overlap_param_gather=zero >= 1, **knobs)


def predict(argv: list[str], tmp_path: Path, capsys) -> tuple[dict, str]:
    path = tmp_path / "predict.json"
    assert cli.main(["predict", "--cluster", CLUSTER, "--json", str(path), "--no-search",
                     *argv]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def wheel_registry(module: str) -> Path:
    """torchtitan 0.3.0's config_registry.py of `module`, from its environment, or a skip."""
    found = sorted((ROOT / ".venv" / "torchtitan-0.3").glob(
        f"lib/python*/site-packages/torchtitan/models/{module}/config_registry.py"))
    if not found:
        pytest.skip("TorchTitan 0.3's environment .venv/torchtitan-0.3 is absent (see "
                    "tests/planner/export/torchtitan03_env.py)")
    return found[0]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_registry_table_is_torchtitans_own(name: str) -> None:
    """Checks: the wheel's function, read by Tessel's ast reader, sets what the table
    holds, for every field Tessel reads (the reader reads TorchTitan's own file too)."""
    module = CONFIGS[name].settings["model.module"]
    settings, _ = read_config_module(f"{wheel_registry(module)}:{name}")
    table = CONFIGS[name].settings

    def read(values: dict) -> dict:
        return {k: v for k, v in values.items() if k.startswith(READ)}

    assert read(settings) == read(table)
    assert settings.get("loss") == table["loss"] == "ChunkedLossWrapper"


# name -> (--gpus, the configuration TorchTitan runs, the model)
REGISTRY_RUNS = {
    # llama3_8b: local batch 1 at 8192 tokens, FSDP over all GPUs, op-level SAC.
    "llama3_8b": (8, titan(data=8, micro_batch_size=1, global_batch_size=8,
                           recompute="selective"), get_preset("llama3-8b")),
    # llama3_70b: tensor parallel 8, local batch 8, full checkpointing.
    "llama3_70b": (64, titan(tensor=8, data=8, micro_batch_size=8, global_batch_size=64,
                             recompute="full"), get_preset("llama3-70b")),
    # llama3_405b: row-wise float8 (Float8LinearConverter's only scaling in 0.3), tensor
    # parallel 8 with async TP under compile, local batch 2, full checkpointing.
    "llama3_405b": (512, titan(tensor=8, data=64, micro_batch_size=2, global_batch_size=128,
                               recompute="full", precision="fp8", fp8_recipe="rowwise",
                               compile=True, compile_loss=True, tp_comm_overlap=True),
                    get_preset("llama3-405b")),
    # deepseek_v3_16b: experts over 8 ranks, loss compiled, 4 x 4096 tokens a rank.
    "deepseek_v3_16b": (8, titan(data=8, expert=8, expert_tensor=1, micro_batch_size=4,
                                 global_batch_size=32, recompute="selective",
                                 compile_loss=True, moe_token_dispatcher="alltoall"), None),
    # deepseek_v3_671b: experts over 2 ranks of 256, no multi-token prediction layer.
    "deepseek_v3_671b": (256, titan(data=256, expert=2, expert_tensor=1, micro_batch_size=4,
                                    global_batch_size=1024, recompute="selective",
                                    compile_loss=True, moe_token_dispatcher="alltoall"),
                         zoo_config("deepseek-v3", {"mtp_num_layers": 0})),
}


@pytest.mark.parametrize("name", list(REGISTRY_RUNS))
def test_a_registry_config_predicts_what_it_runs(name: str, tmp_path: Path, capsys) -> None:
    gpus, expected, model = REGISTRY_RUNS[name]
    report, output = predict(["--torchtitan", name, "--gpus", str(gpus)], tmp_path, capsys)
    launched = report["job_config"]
    job = load_job(name, [], gpus)
    model = model or job.model
    seq = CONFIGS[name].settings["training.seq_len"]
    assert job.model == model.model_copy(update={"seq_length": seq})
    planned = training_plan(job.preset, job.model, Cluster.load(CLUSTER).with_devices(gpus),
                            expected.resolve(gpus))
    assert launched["parallel"] == json.loads(planned.to_json())["parallel"]
    assert launched["predicted"] == json.loads(planned.to_json())["predicted"]
    assert launched["global_batch_size"] == expected.batch.global_batch_size
    flat = " ".join(output.split())
    assert f"{planned.predicted.step_time_s:.3f}" in flat
    assert 'note: attn_backend "flex"' in flat
    assert ("disable_cuda_graphs False" in flat) == ("llama3" in name)


def test_the_deepseek_16b_shape_is_torchtitans() -> None:
    """Checks: DeepSeek-V3 16B (deepseek_v3/__init__.py: _16b) as Tessel builds it: 27
    layers, the first dense, 64 experts of 1408 with two shared, top 6, about 16B weights."""
    model = load_job("deepseek_v3_16b", [], 8).model
    assert (model.num_layers, model.hidden_size, model.num_attention_heads,
            model.vocab_size) == (27, 2048, 16, 102400)
    assert (model.num_experts, model.moe_top_k, model.moe_ffn_hidden_size,
            model.moe_shared_expert_intermediate_size) == (64, 6, 1408, 2816)
    assert 15.5e9 < model.num_parameters() < 16.5e9


def test_overrides_change_the_run(tmp_path: Path, capsys) -> None:
    """Checks: TorchTitan's overrides after -- are read as its command line reads them:
    degrees, a switch, tyro's checkpointing subcommand, a comma-separated list."""
    job = load_job("llama3_70b", ["--parallelism.pipeline_parallel_degree", "2",
                                  "--parallelism.data_parallel_shard_degree=4",
                                  "--training.local_batch_size", "4",
                                  "--training.disable_cuda_graphs", "activation_checkpoint:none",
                                  "--compile.enable", "--compile.components", "model,loss"],
                   None)
    q = job.parallel
    assert (q.dims.tensor, q.dims.pipeline, q.dims.data, job.num_gpus) == (8, 2, 4, 64)
    assert (q.batch.micro_batch_size, q.batch.global_batch_size) == (1, 16)
    assert q.recomputation.recompute == "none"
    assert (q.execution.compile, q.execution.compile_loss) == (True, True)
    assert not any("disable_cuda_graphs" in note for note in job.notes)


MODULE = '''
from torchtitan.components.optimizer import default_adamw
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer

SEQ = 4096


def llama3_8b_tp2() -> Trainer.Config:
    """TP 2 at 4096 tokens."""
    model_spec = model_registry("8B")
    return Trainer.Config(
        model_spec=model_spec,
        optimizer=default_adamw(lr=3e-4),
        training=TrainingConfig(local_batch_size=2 * 2, seq_len=4096, steps=100,
                                disable_cuda_graphs=True),
        parallelism=ParallelismConfig(tensor_parallel_degree=2),
        activation_checkpoint=FullAC.Config(),
    )


def llama3_8b_tp2_cp2() -> Trainer.Config:
    config = llama3_8b_tp2()
    config.parallelism.context_parallel_degree = 2
    config.compile = CompileConfig(enable=True, components=["loss"])
    return config
'''


def test_a_config_module_is_read_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "my_runs.py"
    path.write_text(MODULE)
    job = load_job(f"{path}:llama3_8b_tp2_cp2", [], 16)
    q = job.parallel
    assert (q.dims.tensor, q.dims.context, q.dims.data) == (2, 2, 4)
    assert (q.batch.micro_batch_size, q.batch.global_batch_size, job.model.seq_length) == \
        (4, 16, 4096)
    assert q.recomputation.recompute == "full" and q.execution.compile_loss
    assert job.steps == 100 and job.preset == "llama3-8b"


@pytest.mark.parametrize(("body", "fragment"), [
    ("    return Trainer.Config(training=TrainingConfig(seq_len=compute()))",
     ":3: a call to compute() is not one Tessel reads"),
    ("    return Trainer.Config(training=TrainingConfig(seq_len=SEQ))",
     ":3: the name SEQ is not a value the function assigns"),
    ("    for i in range(2):\n        pass", ":3: for `for i in range(2):` is not a literal "
     "assignment or return"),
    ("    return Trainer.Config(parallelism=ParallelismConfig(tensor_paralel_degree=2))",
     ":3: parallelism has no field tensor_paralel_degree in TorchTitan 0.3 (did you mean "
     "tensor_parallel_degree?)"),
    ("    import os\n    return Trainer.Config(dump_folder=os.environ['X'])",
     ":3: import `import os` is not a literal assignment or return"),
])
def test_a_non_literal_is_refused_by_file_and_line(body: str, fragment: str,
                                                   tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text(f"SEQ = 8192\ndef bad() -> Trainer.Config:\n{body}\n")
    with pytest.raises(JobConfigError) as caught:
        read_config_module(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)) and fragment in message, \
        message


BAD = {
    "unknown registry name": (["--torchtitan", "llama3_7b", "--gpus", "8"], [
        "--torchtitan 'llama3_7b' is not a config Tessel knows (did you mean llama3_70b?): "
        "give one of llama3_8b, llama3_70b, llama3_405b, deepseek_v3_16b"]),
    "unknown override": (["--torchtitan", "llama3_8b", "--gpus", "8", "--",
                          "--parallelism.tensor_paralel_degree", "2"], [
        "override --parallelism.tensor_paralel_degree is not an option of TorchTitan 0.3's "
        "command line (did you mean --parallelism.tensor_parallel_degree?)"]),
    "a model override": (["--torchtitan", "llama3_8b", "--gpus", "8", "--",
                          "--model.flavor", "70B"], ["takes the model from the config"]),
    "pipeline with CUDA graphs": (["--torchtitan", "llama3_70b", "--gpus", "64", "--",
                                   "--parallelism.pipeline_parallel_degree", "2"], [
        "CUDA graphs do not support pipeline parallelism", "--training.disable_cuda_graphs"]),
    "a Megatron-LM flag": (["--torchtitan", "llama3_8b", "--gpus", "8", "--", "--num-layers",
                            "2"], ["--num-layers is a Megatron-LM flag", "give one of the two"]),
    "experts not dividing": (["--torchtitan", "deepseek_v3_16b", "--gpus", "12"], [
        "parallelism.expert_parallel_degree 8 must divide both the model's 64 experts and "
        "data_parallel_shard_degree x context x tensor = 12 ranks"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_torchtitan_job_is_one_line_and_exit_2(case: str, one_line_error) -> None:
    argv, fragments = BAD[case]
    output = one_line_error(["predict", "--cluster", CLUSTER, *argv])
    assert output.startswith("error: ")
    for fragment in fragments:
        assert fragment in output, output
