"""planner.torchtitan: a TorchTitan 0.2 job config read as TorchTitan reads it.

Every key Tessel knows is TorchTitan's, with TorchTitan's default (checked against its own
`JobConfig` where it imports); the model shapes are TorchTitan's flavors; the pipeline
parts are what TorchTitan's own split generates; absent keys take TorchTitan's defaults;
each rule TorchTitan enforces, and each key Tessel cannot price, is one JobConfigError
naming the key.
"""

from __future__ import annotations

import ast
import importlib
import json
import importlib.util
import math
import sys
import tomllib
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from planner.models.presets import get_preset
from planner.torchtitan import JobConfigError, torchtitan_job
from planner.torchtitan.job import FLAVORS
from planner.torchtitan.keys import IGNORED, JOB_CONFIG, READ, flatten
from planner.torchtitan.parallel_config import _generated_parts, _Values


def titan_source(module: str) -> ast.Module:
    """The source of a module of the installed TorchTitan 0.2, parsed, or a skip. Its
    models and pipelining import torchdata and triton (not installed here): the pieces
    these tests hold Tessel to are plain Python, read from the source."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.origin is None:
        pytest.skip("torchtitan 0.2 is not installed: make test installs it")
    path = Path(spec.origin).parent.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return ast.parse(path.read_text())


def titan_module(name: str) -> Any:
    """A module of the installed TorchTitan 0.2, or a skip saying why not. Its package
    imports triton MoE kernels (a GPU package) that no config code calls: that one module
    is stubbed, as tests/planner/export/test_engines.py does."""
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan 0.2 is not installed: make test installs it")
    kernels = types.ModuleType("torchtitan.models.moe.kernels")
    kernels.generate_permute_indices = None
    sys.modules.setdefault(kernels.__name__, kernels)
    try:
        return importlib.import_module(name)
    except ImportError as error:
        pytest.skip(f"torchtitan does not import: {error}")


def flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def job(text: str, gpus: int | None = None):
    return torchtitan_job(tomllib.loads(text), gpus, "job.toml")


def error_of(text: str, gpus: int | None = None) -> str:
    with pytest.raises(JobConfigError) as caught:
        job(text, gpus)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("job.toml: ")
    return message


LLAMA8 = '[model]\nflavor = "8B"\n'


def test_every_key_is_torchtitans_with_its_default() -> None:
    config = titan_module("torchtitan.config.job_config")
    defaults = flat(asdict(config.JobConfig()))
    assert {key: spec.default for key, spec in JOB_CONFIG.items()} == defaults


def test_the_presets_are_torchtitans_llama3_flavors() -> None:
    """TorchTitan's `llama3_args` (read from its source), its FeedForward's width (2/3 of
    4 x dim, times ffn_dim_multiplier, rounded up to multiple_of) and its default
    vocabulary, 128256."""
    tree = titan_source("torchtitan.models.llama3")
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", "") == "llama3_args")
    flavors = {ast.literal_eval(key): {kw.arg: ast.literal_eval(kw.value)
                                       for kw in call.keywords}
               for key, call in zip(table.keys, table.values)}
    for flavor, preset in FLAVORS.items():
        args, model = flavors[flavor], get_preset(preset)
        hidden = int(args["ffn_dim_multiplier"] * int(2 * 4 * args["dim"] / 3))
        ffn = args["multiple_of"] * math.ceil(hidden / args["multiple_of"])
        assert (model.num_layers, model.hidden_size, model.num_attention_heads,
                model.num_kv_heads, model.ffn_size, model.rotary_base) == (
            args["n_layers"], args["dim"], args["n_heads"], args["n_kv_heads"], ffn,
            args["rope_theta"])
        assert model.vocab_size == 128256 and "vocab_size" not in args


@pytest.mark.parametrize("stages, layers, first, last", [
    (2, 32, 1, 1), (4, 32, 1, 1), (8, 126, 1, 1), (16, 126, 1, 1), (4, 32, 0, 0),
    (3, 80, 2, 1), (32, 126, 1, 1), (1, 32, 1, 1), (10, 80, 1, 3)])
def test_pipeline_parts_are_torchtitans_own_split(
        stages: int, layers: int, first: int, last: int) -> None:
    tree = titan_source("torchtitan.distributed.pipeline_parallel")
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
                    and node.name == "generate_llm_fqn_per_model_part")
    scope: dict[str, Any] = {}
    exec(compile(ast.Module([function], []), "pipeline_parallel.py", "exec"), scope)
    values = _Values(flatten({}, "job.toml"), "job.toml")
    assert _generated_parts(values, stages, layers, first, last) == \
        scope["generate_llm_fqn_per_model_part"](stages, layers, first, last)


def test_a_bare_job_config_is_torchtitans_defaults() -> None:
    run = job(LLAMA8, gpus=8)
    q = run.parallel
    assert (run.flavor, run.model.seq_length, run.num_gpus) == ("8B", 2048, 8)
    d = q.dims
    assert (d.tensor, d.pipeline, d.context, d.data, q.sharding.zero_stage) == (1, 1, 1, 8, 3)
    # local batch 8 per data rank, global batch local x data; no accumulation.
    assert (q.batch.micro_batch_size, q.batch.global_batch_size, q.num_micro_batches) == (8, 64, 1)
    # [activation_checkpoint] absent: selective with option "2", every second block.
    assert (q.recomputation.recompute, q.recomputation.recompute_every) == ("full", 2)
    assert (q.numerics.precision, q.execution.engine, q.sharding.fsdp_reshard_after_forward,
            q.execution.compile) == (
        "bf16", "torchtitan", "default", False)
    assert q.overlap.overlap_grad_reduce and q.overlap.overlap_param_gather
    assert not q.sharding.sequence_parallel
    assert any("training.seq_len 2048" in note for note in run.notes)
    assert any("-1: 8" in note for note in run.notes)
    assert run.ignored == []


def test_keys_that_change_nothing_are_listed_as_ignored() -> None:
    run = job(LLAMA8 + 'hf_assets_path = "x"\n[job]\ndump_folder = "out"\n[optimizer]\n'
              'lr = 1e-4\n[checkpoint]\nenable = true\nfolder = "ckpt"\n[metrics]\n'
              'enable_wandb = true\n[comm]\nmode = "default"\n', gpus=8)
    assert run.ignored == ["job.dump_folder", "metrics.enable_wandb", "model.hf_assets_path",
                           "optimizer.lr", "checkpoint.enable", "checkpoint.folder",
                           "comm.mode"]
    assert all(JOB_CONFIG[key].effect != READ for key in run.ignored)


def test_tensor_context_and_fsdp_degrees() -> None:
    run = job(LLAMA8 + "[training]\nseq_len = 8192\nlocal_batch_size = 2\n"
              "[parallelism]\ntensor_parallel_degree = 4\ncontext_parallel_degree = 2\n"
              'data_parallel_shard_degree = 8\nfsdp_reshard_after_forward = "never"\n')
    q = run.parallel
    assert run.num_gpus == 64  # the degrees give it
    assert (q.dims.tensor, q.dims.context, q.dims.data, q.sharding.zero_stage,
            q.sharding.sequence_parallel) == (
        4, 2, 8, 3, True)
    assert q.sharding.fsdp_reshard_after_forward == "never"
    # FSDP2 shards over shard x context even with one data replica.
    assert job(LLAMA8 + "[training]\nseq_len = 8192\n[parallelism]\n"
               "context_parallel_degree = 2\ndata_parallel_shard_degree = 1\n"
               ).parallel.sharding.zero_stage == 3


def test_cpu_offload_is_fsdp2s_policy_over_parameters_and_optimizer() -> None:
    """Checks: training.enable_cpu_offload (FSDP2's CPUOffloadPolicy in apply_fsdp) reads
    as both the optimizer and the parameters on the CPU; absent, neither."""
    offload = job(LLAMA8 + "[training]\nenable_cpu_offload = true\n", 8).parallel.offload
    assert (offload.offload_optimizer, offload.offload_params) == ("cpu", "cpu")
    assert offload.optimizer_offload_fraction == 1.0
    offload = job(LLAMA8, 8).parallel.offload
    assert (offload.offload_optimizer, offload.offload_params) == ("none", "none")


def test_ddp_runs_alone_and_hsdp_is_refused() -> None:
    q = job(LLAMA8 + "[parallelism]\ndata_parallel_replicate_degree = 8\n"
            "data_parallel_shard_degree = 1\n").parallel
    assert (q.dims.data, q.sharding.zero_stage, q.overlap.overlap_param_gather) == (8, 0, False)
    assert "HSDP" in error_of(LLAMA8 + "[parallelism]\ndata_parallel_replicate_degree = 2\n"
                              "data_parallel_shard_degree = 4\n")
    assert "DDP does not compose" in error_of(
        LLAMA8 + "[parallelism]\ndata_parallel_replicate_degree = 2\n"
        "data_parallel_shard_degree = 1\ntensor_parallel_degree = 2\n")


def test_1f1b_takes_torchtitans_uneven_split() -> None:
    run = job(LLAMA8 + "[training]\nlocal_batch_size = 8\n[parallelism]\n"
              "pipeline_parallel_degree = 4\n", gpus=32)
    q = run.parallel
    assert (q.dims.pipeline, q.pipelining.schedule, q.pipelining.virtual_pipeline,
            q.batch.micro_batch_size) == (
        4, "1f1b", 1, 1)
    assert q.num_micro_batches == 8 and q.dims.data == 8
    # 32 blocks + embedding + output as 34 over 4 stages: 9, 9, 8, 8 less the two ends.
    assert run.layers_per_stage == [8, 9, 8, 7] and run.chunk_layers is None


def test_interleaved_parts_as_given_or_generated() -> None:
    parts = [["tok_embeddings", *(f"layers.{i}" for i in range(8))],
             *([f"layers.{i}" for i in range(s, s + 8)] for s in (8, 16)),
             [*(f"layers.{i}" for i in range(24, 32)), "norm", "output"]]
    text = (LLAMA8 + "[training]\nlocal_batch_size = 4\n[parallelism]\n"
            'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "interleaved1f1b"\n')
    given = job(text + f"module_fqns_per_model_part = {parts!r}\n".replace("'", '"'), 16)
    q = given.parallel
    assert (q.pipelining.schedule, q.pipelining.virtual_pipeline,
            q.num_micro_batches) == ("interleaved", 2, 4)
    assert given.layers_per_stage is None and given.chunk_layers is None
    # TorchTitan's own split of 34 weighted layers into 4 parts: 8, 9, 8, 7 blocks.
    generated = job(text, 16)
    assert generated.chunk_layers == [8, 9, 8, 7]
    assert generated.layers_per_stage == [16, 16]
    # 3 weighted layers a stage: ceil(34 / 3) = 12 stages, 6 a rank.
    per_stage = job(text + "pipeline_parallel_layers_per_stage = 3\n", 16)
    assert per_stage.parallel.pipelining.virtual_pipeline == 6
    assert per_stage.chunk_layers == [2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1]
    assert "makes 9 stages" in error_of(text + "pipeline_parallel_layers_per_stage = 4\n", 16)


def test_dualpipev_parts_run_in_v_order() -> None:
    # TorchTitan's "DualPipeV" (torch's ScheduleDualPipeV): two parts per rank, placed in
    # V order by pipeline_module_split's "v" style, rank r holding parts r and 2 pp - 1 - r.
    text = (LLAMA8 + "[training]\nlocal_batch_size = 4\n[parallelism]\n"
            'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"\n')
    generated = job(text, 16)
    q = generated.parallel
    assert (q.pipelining.schedule, q.pipelining.virtual_pipeline,
            q.num_micro_batches) == ("dualpipev", 2, 4)
    assert generated.chunk_layers == [8, 9, 8, 7]
    assert generated.layers_per_stage == [8 + 7, 9 + 8]  # parts 0 and 3, 1 and 2


@pytest.mark.parametrize("table, expected", [
    ('mode = "none"', ("none", 1)),
    ('mode = "full"', ("full", 1)),
    ('mode = "selective"\nselective_ac_option = "op"', ("selective", 1)),
    ('mode = "selective"\nselective_ac_option = "3"', ("full", 3)),
    ('mode = "selective"\nselective_ac_option = "1"', ("full", 1)),
    ('mode = "selective"\nselective_ac_option = "0"', ("full", 1)),  # 0: every block too
])
def test_activation_checkpointing(table: str, expected: tuple[str, int]) -> None:
    q = job(LLAMA8 + f"[activation_checkpoint]\n{table}\n", gpus=8).parallel
    assert (q.recomputation.recompute, q.recomputation.recompute_every) == expected


def test_float8_tensorwise_and_its_all_gathers() -> None:
    fp8 = LLAMA8 + 'converters = ["quantize.linear.float8"]\n'
    q = job(fp8 + "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n"
            "precompute_float8_dynamic_scale_for_fsdp = true\n", gpus=8).parallel
    numerics = q.numerics
    assert (numerics.precision, numerics.fp8_recipe, numerics.fp8_param_gather) == (
        "fp8", "tensorwise", True)
    named = job(fp8 + '[quantize.linear.float8]\nrecipe_name = "tensorwise"\n', 8).parallel
    assert (named.numerics.precision, named.numerics.fp8_param_gather) == ("fp8", False)
    # No shard degree above 1: TorchTitan gathers bf16 weights (none to gather here).
    alone = job(fp8 + "[parallelism]\ndata_parallel_shard_degree = 1\n"
                "tensor_parallel_degree = 8\n[quantize.linear.float8]\n"
                "enable_fsdp_float8_all_gather = true\n")
    assert not alone.parallel.numerics.fp8_param_gather
    assert any("no effect" in note for note in alone.notes)
    mx = job(LLAMA8 + 'converters = ["quantize.linear.mx"]\n', gpus=8).parallel
    assert (mx.numerics.precision, mx.numerics.fp8_recipe) == ("fp8", "mxfp8")


def test_compile_and_async_tensor_parallelism() -> None:
    text = (LLAMA8 + "[parallelism]\ntensor_parallel_degree = 8\n"
            "enable_async_tensor_parallel = true\n")
    q = job(text + "[compile]\nenable = true\n", gpus=8).parallel
    assert q.execution.compile and q.overlap.tp_comm_overlap and q.sharding.sequence_parallel
    assert q.execution.compile_loss  # components default to ["model", "loss"]
    assert "needs compile.enable = true" in error_of(text, gpus=8)
    # The loss alone (DeepSeek-V3 16B's config): its blocks run eagerly.
    loss = job(LLAMA8 + '[compile]\nenable = true\ncomponents = ["loss"]\n', gpus=8).parallel
    assert (loss.execution.compile, loss.execution.compile_loss) == (False, True)


def test_pipelined_gradient_accumulation_is_refused() -> None:
    message = error_of(LLAMA8 + "[training]\nlocal_batch_size = 4\nglobal_batch_size = 64\n"
                       "[parallelism]\npipeline_parallel_degree = 2\n", gpus=16)
    assert "runs the pipeline schedule 2 times a step" in message
    assert "local_batch_size = 8" in message
    # Without pipelining, accumulation is micro-batches of one step.
    q = job(LLAMA8 + "[training]\nlocal_batch_size = 2\nglobal_batch_size = 64\n",
            gpus=8).parallel
    assert (q.batch.micro_batch_size, q.num_micro_batches) == (2, 4)


BAD = {
    "unknown key": (LLAMA8 + "[parallelism]\ntensor_parallel_degre = 2\n",
                    "parallelism.tensor_parallel_degre is not a key of TorchTitan 0.2's job "
                    "config (did you mean parallelism.tensor_parallel_degree?)"),
    "unknown table": (LLAMA8 + "[float8]\nenable_fsdp_float8_all_gather = true\n",
                      "[float8] is not a table of TorchTitan 0.2's job config (did you mean "
                      "[quantize.linear.float8]?)"),
    "a value where a table is": ("model = 3\n", "[model] is a table"),
    "unknown flavor": ('[model]\nflavor = "7B"\n', 'model.flavor = "7B" is not a Llama 3 '
                       "flavor of TorchTitan 0.2; use 8B, 70B, 405B"),
    "debug flavor by default": ("[training]\nsteps = 10\n",
                                "model.flavor = \"debugmodel\" (TorchTitan's default)"),
    "another model": ('[model]\nname = "llama4"\n', 'model.name = "llama4": Tessel predicts'),
    "degrees not multiplying to the GPUs": (
        LLAMA8 + "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 4\n",
        "data_parallel_shard_degree 4 x tensor_parallel_degree 4 = 16 GPUs, but --gpus is 8"),
    "-1 without --gpus": (LLAMA8, "add --gpus N"),
    "-1 not whole": (LLAMA8 + "[parallelism]\ntensor_parallel_degree = 3\n",
                     "--gpus 8 is not divisible by tensor_parallel_degree 3"),
    "a degree as text": (LLAMA8 + '[parallelism]\ntensor_parallel_degree = "2"\n',
                         'parallelism.tensor_parallel_degree = "2" must be a whole number'),
    "tensor not dividing the heads": (
        LLAMA8 + "[parallelism]\ndata_parallel_shard_degree = 1\ntensor_parallel_degree = 16\n"
        "[training]\nseq_len = 8192\n", "must divide the model's 32 attention heads and 8"),
    "seq_len not splitting": (LLAMA8 + "[parallelism]\ncontext_parallel_degree = 4\n"
                              "[training]\nseq_len = 100\n", "must be a multiple of"),
    "unpriced key": (LLAMA8 + "[training]\ngc_debug = true\n",
                     "training.gc_debug = true changes the step's time"),
    "cpu offload under DDP": (
        LLAMA8 + "[parallelism]\ndata_parallel_shard_degree = 1\n"
        "data_parallel_replicate_degree = 8\n[training]\nenable_cpu_offload = true\n",
        "training.enable_cpu_offload = true without FSDP2"),
    "float8 with 16-bit weight gradients": (
        LLAMA8 + 'converters = ["quantize.linear.float8"]\n'
        '[quantize.linear.float8]\nrecipe_name = "rowwise_with_gw_hp"\n',
        "weight gradients in 16 bits beside fp8 matmuls"),
    "float8's old name": (LLAMA8 + 'converters = ["float8"]\n',
                          'registers it as "quantize.linear.float8"'),
    "converters as text": (LLAMA8 + 'converters = "quantize.linear.float8"\n',
                           "must be a list of names"),
    "all-gather with a recipe": (
        LLAMA8 + 'converters = ["quantize.linear.float8"]\n[quantize.linear.float8]\n'
        'recipe_name = "tensorwise"\nenable_fsdp_float8_all_gather = true\n',
        "TorchTitan refuses the two together"),
    "unpriced schedule": (LLAMA8 + "[parallelism]\npipeline_parallel_degree = 2\n"
                          'pipeline_parallel_schedule = "ZBVZeroBubble"\n',
                          "Tessel prices 1F1B, Interleaved1F1B, GPipe and DualPipeV"),
    "dualpipev of three parts a rank": (
        LLAMA8 + "[parallelism]\npipeline_parallel_degree = 2\n"
        'pipeline_parallel_schedule = "DualPipeV"\npipeline_parallel_layers_per_stage = 6\n',
        "runs exactly two model parts per rank"),
    "dualpipev of too few micro-batches": (
        LLAMA8 + "[training]\nlocal_batch_size = 3\n[parallelism]\n"
        'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "DualPipeV"\n',
        "DualPipeV needs at least 4 micro-batches"),
    "unknown schedule": (LLAMA8 + "[parallelism]\npipeline_parallel_degree = 2\n"
                         'pipeline_parallel_schedule = "2F2B"\n',
                         "is not a schedule of torch.distributed.pipelining"),
    "memory budget": (LLAMA8 + '[activation_checkpoint]\nmode = "memory_budget"\n',
                      "lets the compiler choose"),
    "bad layer option": (LLAMA8 + '[activation_checkpoint]\nselective_ac_option = "x"\n',
                         'must be "op" or a whole number'),
    "loss parallel off": (LLAMA8 + "[parallelism]\ntensor_parallel_degree = 2\n"
                          "disable_loss_parallel = true\n", "disable_loss_parallel = true"),
    "parts out of order": (
        LLAMA8 + "[parallelism]\npipeline_parallel_degree = 2\nmodule_fqns_per_model_part = "
        '[["tok_embeddings", "layers.1"], ["layers.0", "norm", "output"]]\n',
        '"layers.1" where "layers.0" belongs'),
    "another optimizer": (LLAMA8 + '[optimizer]\nname = "Lion"\n', "Adam and AdamW only"),
    "alltoall context": (LLAMA8 + "[parallelism]\ncontext_parallel_degree = 2\n"
                         'context_parallel_rotate_method = "alltoall"\n',
                         "changes the key/value exchange"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_job_config_is_one_error_naming_the_key(case: str) -> None:
    text, fragment = BAD[case]
    gpus = {"-1 without --gpus": None, "tensor not dividing the heads": 16}.get(case, 8)
    assert fragment in error_of(text, gpus)


def test_each_refused_key_names_what_it_changes() -> None:
    for key, spec in JOB_CONFIG.items():
        assert spec.effect in (READ, IGNORED) or (spec.neutral and spec.neutral[0] ==
                                                  spec.default), key


# (layers, model parts) of the pipelines the search and the reader split as TorchTitan does.
SPLITS = [(61, 4), (61, 16), (94, 8), (32, 8), (80, 6), (126, 32), (27, 4)]


def test_model_parts_are_split_as_torchtitans_own_function_splits_them() -> None:
    """Checks: `rules.part_layers` against torchtitan 0.3.0's _generate_llm_fqn_per_model_
    part, run in its environment (the embedding and output weighing a layer each)."""
    import subprocess

    from planner.torchtitan.rules import part_layers
    from tests.planner.export.torchtitan03_env import PYTHON, SKIP

    if not PYTHON.exists():
        pytest.skip(SKIP)
    probe = ("import json, sys\n"
             "from torchtitan.distributed.pipeline_parallel import "
             "_generate_llm_fqn_per_model_part as split\n"
             "print(json.dumps([[sum(n.startswith('layers.') for n in part) for part in "
             "split(parts, layers)] for layers, parts in json.loads(sys.argv[1])]))")
    done = subprocess.run([str(PYTHON), "-c", probe, json.dumps(SPLITS)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout) == [part_layers(layers, parts) for layers, parts in SPLITS]


def test_v_shaped_parts_run_in_v_order() -> None:
    from planner.torchtitan.rules import rank_of_part

    assert [rank_of_part(c, 4, True) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [rank_of_part(c, 4, False) for c in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
