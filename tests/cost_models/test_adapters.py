"""cost_models.adapters and a LoRA plan's memory and time, against hand computations on
Llama 3 8B (h 4096, 8 key/value heads of 128, MLP 14336, 32 layers, vocabulary 128256,
untied): rank-16 adapters on all seven linears of a layer are 16 x (in + out) each."""

from __future__ import annotations

import pytest

from cost_models import adapters, step_time
from cost_models.adapters import NF4_BITS, adapted, adapter_layouts, layer_split
from cost_models.identity_memo import IdentityMemo
from cost_models.stage_parameters import ParameterLayout
from cost_models.pipeline_memory import StageLayout
from cost_models.pipeline_timing import StagePhases
from cost_models.step_time import predict_step, stage_phases
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig

MODEL = zoo_config("llama3-8b", {"seq_length": 2048})
H100 = Cluster.load("dgx-h100").with_devices(1)
# q and o: 4096 -> 4096; k and v: 4096 -> 1024; gate and up: 4096 -> 14336; down back.
PER_LAYER = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
ADAPTED_PER_LAYER = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336
GIB = 2**30


def test_nf4_with_double_quantization_is_4_127_bits() -> None:
    assert NF4_BITS == pytest.approx(4.127, abs=5e-4)  # QLoRA, Sec. 3


def test_adapters_split_as_their_linear() -> None:
    column = ParameterLayout("layers.0.attn.q_proj.weight", (4096, 4096), 0, "layers.0")
    row = ParameterLayout("layers.0.attn.o_proj.weight", (4096, 4096), 1, "layers.0")
    a, b = adapter_layouts(column, 16)
    assert (a.shape, a.tensor_dim, b.shape, b.tensor_dim) == ((16, 4096), None, (4096, 16), 0)
    a, b = adapter_layouts(row, 16)
    assert (a.shape, a.tensor_dim, b.shape, b.tensor_dim) == ((16, 4096), 1, (4096, 16), None)
    assert adapted(column, ("linear_qkv",)) and not adapted(column, ("linear_proj",))
    norm = ParameterLayout("layers.0.attn_norm.weight", (4096,), None, "layers.0")
    assert not adapted(norm, ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"))


def test_a_layers_adapters_by_hand() -> None:
    lora = ParallelConfig.of(finetune="lora")
    assert layer_split(MODEL, lora) == (ADAPTED_PER_LAYER, PER_LAYER, 0.0, 0.0)
    assert 32 * PER_LAYER == 41_943_040  # the 42M of Llama 3 8B's rank-16 all-linear LoRA
    attention_only = lora.but(lora_targets=("linear_qkv",), lora_rank=8)
    assert layer_split(MODEL, attention_only)[1] == 8 * (2 * 4096 + 2 * 1024 + 2 * 4096)
    # Beside tensor parallelism: A whole and B split (column), A split and B whole (row).
    split = layer_split(MODEL, lora.but(tensor=2))[1]
    column = 16 * ((4096 + 4096 / 2) + 2 * (4096 + 1024 / 2) + 2 * (4096 + 14336 / 2))
    row = 16 * ((4096 / 2 + 4096) + (14336 / 2 + 4096))
    assert split == column + row


def test_lora_memory_by_hand() -> None:
    params = MODEL.num_parameters()
    lora = predict_step(MODEL, H100, ParallelConfig.of(global_batch_size=2, finetune="lora",
                                                       recompute="full"))
    kinds = lora.memory_breakdown_gib
    adapters = 32 * PER_LAYER
    assert kinds["frozen weights"] == pytest.approx(2 * params / GIB)
    # Megatron-LM's mixed precision for the adapters: bf16 weights, fp32 main gradients,
    # fp32 master weights and moments.
    assert kinds["adapters"] == pytest.approx(2 * adapters / GIB)
    assert kinds["adapters' gradients"] == pytest.approx(4 * adapters / GIB)
    assert kinds["adapters' optimizer"] == pytest.approx(12 * adapters / GIB)
    qlora = predict_step(MODEL, H100, ParallelConfig.of(global_batch_size=2, finetune="qlora",
                                                        recompute="full"))
    quantized = 32 * ADAPTED_PER_LAYER
    assert qlora.memory_breakdown_gib["frozen weights"] == pytest.approx(
        (2 * (params - quantized) + NF4_BITS / 8 * quantized) / GIB, rel=1e-5)


def test_a_frozen_base_skips_its_weight_gradients(monkeypatch) -> None:
    # The adapters at their roofline price (the shipped scale, fitted, is 0: see
    # ADAPTER_TIME_SCALE), so that their matmuls show.
    monkeypatch.setattr(adapters, "ADAPTER_TIME_SCALE", 1.0)
    monkeypatch.setattr(step_time, "_LAYER_PASSES", IdentityMemo(16))

    def phases(finetune: str) -> StagePhases:
        parallel = ParallelConfig.of(global_batch_size=2, micro_batch_size=2,
                                     finetune=finetune).resolve(1)
        return stage_phases(MODEL, H100, parallel, [StageLayout(32, 1, 1)])[0]

    full, lora, qlora = phases("none"), phases("lora"), phases("qlora")
    # The adapters' matmuls run beside the base's (each reads the linear's input again);
    # backward drops the base's weight-gradient GEMMs, a third of the linears' FLOPs.
    assert full.forward < lora.forward < qlora.forward
    assert lora.backward < full.backward * 0.9
    # QLoRA dequantizes each base weight before the forward's and the backward's matmuls.
    assert qlora.backward - lora.backward == pytest.approx(qlora.forward - lora.forward)
    step = predict_step(MODEL, H100, ParallelConfig.of(global_batch_size=2, finetune="lora"))
    assert step.optimizer_s < predict_step(
        MODEL, H100, ParallelConfig.of(global_batch_size=2)).optimizer_s / 100


def test_the_published_adapter_runs_fit_the_shipped_scale() -> None:
    """ADAPTER_TIME_SCALE is what benchmarks/finetune_accuracy.py fits to the adapter rows."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "finetune_accuracy", Path(__file__).parents[2] / "benchmarks" / "finetune_accuracy.py")
    assert spec and spec.loader
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    runs, _ = benchmark.read_runs()
    shipped = adapters.ADAPTER_TIME_SCALE
    try:
        fitted = benchmark.fit([run for run in runs
                                if run.parallel.finetuning.finetune in ("lora", "qlora")])
    finally:
        adapters.ADAPTER_TIME_SCALE = shipped
        step_time._LAYER_PASSES.clear()
    assert fitted == shipped
