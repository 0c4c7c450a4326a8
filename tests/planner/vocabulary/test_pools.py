"""Mixed clusters (`planner.vocabulary.pools`): a file of pools loads, each stage is priced
on its own pool's machines and the transfer between pools over the link between them, and
a bad pooled file is refused in one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cost_models.pipeline_memory import StageLayout
from cost_models.step_time import predict_stages, stage_phases
from planner import cli
from planner.models.presets import zoo_config
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.pools import PooledCluster, load_any

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MIXED = FIXTURES / "h100-a100.yaml"


def test_a_file_of_pools_loads_each_pool_sized() -> None:
    pooled = load_any(str(MIXED))
    assert isinstance(pooled, PooledCluster)
    assert pooled.num_devices == 16 and pooled.pool(0).num_devices == 8
    assert pooled.pool(0).device.name == "H100-SXM5-80GB"
    assert pooled.pool(1).device.name == "A100-SXM4-80GB"
    assert pooled.pool(1).num_devices == 8
    assert pooled.between_pools.bandwidth_gbs == 25
    # A plain cluster file or preset still loads as one kind of machine.
    assert isinstance(load_any("dgx-h100"), Cluster)


def test_each_stage_is_priced_on_its_pool_and_the_crossing_on_the_link() -> None:
    pooled = load_any(str(MIXED))
    model = zoo_config("llama3-70b", {"num_layers": 8})
    parallel = ParallelConfig.of(tensor=8, data=1, global_batch_size=16, micro_batch_size=1,
                                 recompute="full", zero_stage=1, sequence_parallel=True)
    stages = [StageLayout(5, 8, 1, 0), StageLayout(3, 8, 1, 1)]
    mixed = stage_phases(model, pooled, parallel, stages)
    # The A100 stage as the A100 node alone prices a last stage of 3 layers, the H100
    # stage as the H100 node prices a first stage of 5: kernels and collectives alike.
    on_a100 = stage_phases(model, pooled.pool(1), parallel,
                           [StageLayout(5, 8, 1), StageLayout(3, 8, 1)])[1]
    on_h100 = stage_phases(model, pooled.pool(0), parallel,
                           [StageLayout(5, 8, 1), StageLayout(3, 8, 1)])[0]
    for phase in ("forward", "backward", "recompute", "forward_communication",
                  "backward_communication"):
        assert getattr(mixed[1], phase) == getattr(on_a100, phase)
        assert getattr(mixed[0], phase) == getattr(on_h100, phase)
    assert mixed[1].forward > 2 * mixed[0].forward / 5 * 3  # an A100 layer: > 2x an H100's
    # The activation out and gradient in across the pools: 1 x 8192 x 8192 bf16 over
    # tensor 8 = 16 MiB each way over 25 GB/s (at the A100's scale-out efficiency), plus
    # the link's 10 us and the collective's launch.
    a100 = pooled.pool(1).device.efficiency
    message = 8192 * 8192 * 2 / 8
    expected = 2 * (message / (25e9 * a100.inter_node_bandwidth) + 10e-6
                    + a100.collective_overhead_us * 1e-6)
    assert mixed[0].transfer == pytest.approx(expected, rel=1e-12)
    prediction = predict_stages(model, pooled, parallel, stages)
    assert prediction.pipeline_comm_s == pytest.approx(16 * expected, rel=1e-12)
    # MFU over both pools' peaks: 8 H100 at 989 and 8 A100 at 312 bf16 TFLOP/s.
    model_flops = prediction.model_tflops_per_gpu * 16 * prediction.step_time_s * 1e12
    peaks = 8 * pooled.pool(0).device.peak_tflops["bf16"] * 1e12 \
        + 8 * pooled.pool(1).device.peak_tflops["bf16"] * 1e12
    assert prediction.mfu == pytest.approx(model_flops / prediction.step_time_s / peaks)


def _write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


GOOD = {"name": "mixed", "pools": [{"name": "h100", "cluster": "dgx-h100", "devices": 8},
                                   {"name": "a100", "cluster": "dgx-a100-80g", "devices": 8}],
        "between_pools": {"bandwidth_gbs": 25, "latency_us": 10}}


@pytest.mark.parametrize("change, words", [
    ({"pools": [{"name": "h100", "cluster": "dgx-h100", "devices": 0}]},
     "pools.0.devices: Input should be greater than or equal to 1"),
    ({"between_pools": None}, "between_pools: 2 pools are joined by no fabric"),
    ({"between_pools": {"bandwidth_gbs": 0, "latency_us": 10}},
     "between_pools.bandwidth_gbs: Input should be greater than 0"),
    ({"between_pools": {"bandwidth_gbs": -5, "latency_us": 10}},
     "between_pools.bandwidth_gbs: Input should be greater than 0"),
    ({"pools": [{"name": "h100", "cluster": "dgx-h100", "devices": 12}]},
     "pool 'h100': Cluster 'dgx-h100' has 8 devices per node, so 12 devices"),
    ({"pools": [{"name": "x", "cluster": "dgx-h10", "devices": 8}]},
     "pool 0 (x): Unknown cluster preset 'dgx-h10'"),
    ({"pools": [{"name": "a", "cluster": "dgx-h100", "devices": 8},
                {"name": "a", "cluster": "dgx-h100", "devices": 8}]},
     "names ['a', 'a'] repeat"),
    ({"pools": []}, "pools: List should have at least 1 item"),
])
def test_a_bad_file_of_pools_gets_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, words: str) -> None:
    path = _write(tmp_path, {**GOOD, **change})
    with pytest.raises(ValueError, match=None) as error:
        load_any(path)
    assert words in str(error.value) and "\n" not in str(error.value)
    code = cli.main(["llama3-8b", "--cluster", path, "--gpus", "16",
                     "--global-batch-size", "16"])
    said = capsys.readouterr()
    said = said.out + said.err
    assert code == 2 and "Traceback" not in said
    assert words in said and len(said.strip().splitlines()) == 1


def test_a_mixed_cluster_is_refused_where_it_cannot_be_planned(
        capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["llama3-8b", "--cluster", str(MIXED), "--gpus", "8", "--global-batch-size", "8"],
         "--gpus 8: " + str(MIXED) + " has 8 h100 + 8 a100 = 16 devices; give --gpus 16"),
        (["llama3-8b", "--cluster", str(MIXED), "--gpus", "16", "--global-batch-size", "16",
          "--segment", "1"], "--segment: not available on a mixed cluster"),
        (["predict", "--cluster", str(MIXED), "--gpus", "16", "--", "pretrain_gpt.py",
          "--tensor-model-parallel-size", "8"],
         "a mixed cluster (pools) is planned by `plan` and `plan check` only"),
    ]
    for argv, words in cases:
        code = cli.main(argv)
        said = capsys.readouterr()
        said = said.out + said.err
        assert code == 2 and words in said and len(said.strip().splitlines()) == 1, said


SLOW_CPU = {"name": "slow-cpu", "device": {"name": "slow-cpu", "peak_tflops": {"fp32": 0.06},
                                           "memory_gib": 24, "memory_bandwidth_gbs": 12},
            "devices_per_node": 8, "intra_node": {"bandwidth_gbs": 0.5, "latency_us": 200},
            "inter_node": {"bandwidth_gbs": 1, "latency_us": 100}}
TINY_LLAMA = ["llama", "--num-layers", "8", "--hidden-size", "256", "--num-attention-heads",
              "4", "--vocab-size", "256", "--seq-length", "64", "--gpus", "4",
              "--global-batch-size", "32"]


def test_plan_on_pools_writes_its_plan_and_report_and_refuses_engines_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {
        "name": "fast-slow", "pools": [{"name": "fast", "cluster": "cpu", "devices": 2},
                                       {"name": "slow", "cluster": SLOW_CPU, "devices": 2}],
        "between_pools": {"bandwidth_gbs": 0.5, "latency_us": 200}})
    plan_path, report = tmp_path / "plan.json", tmp_path / "report.html"
    code = cli.main([*TINY_LLAMA, "--cluster", path, "--json", str(plan_path),
                     "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    plan = json.loads(plan_path.read_text())
    assert [(s["pool"], s["layers"], s["first_device"]) for s in plan["stages"]] == [
        ("slow", [0, 3], 0), ("fast", [3, 8], 2)]
    assert "stages by pool" in out and report.read_text().startswith("<!DOCTYPE html>")
    code = cli.main([*TINY_LLAMA, "--cluster", path, "--emit", "pytorch", str(tmp_path)])
    said = capsys.readouterr()
    said = said.out + said.err
    assert code == 2 and said.strip().splitlines()[-1].startswith(
        "error: --emit: the best plan's pipeline crosses pools (fast, slow); Megatron-LM, "
        "TorchTitan and DeepSpeed run one kind of GPU")


def test_engines_that_describe_one_layout_refuse_a_plan_across_pools() -> None:
    """The engines' own configs describe one layout on one kind of machine: a plan whose
    stages run on two pools is refused by name, not written for the first pool's GPUs."""
    from planner.export.engines import Refusal, engine_files
    from planner.models.config import TransformerConfig
    from planner.models.presets import FAMILIES
    from planner.plans.pool_plan import plan_pools
    from planner.vocabulary.parallel import FixedKnobs

    pooled = PooledCluster.model_validate({
        "name": "fast-slow", "pools": [{"name": "fast", "cluster": "cpu", "devices": 2},
                                       {"name": "slow", "cluster": SLOW_CPU, "devices": 2}],
        "between_pools": {"bandwidth_gbs": 0.5, "latency_us": 200}})
    model = TransformerConfig(**FAMILIES["llama"], num_layers=8, hidden_size=256,
                              num_attention_heads=4, vocab_size=256, seq_length=64)
    plan = plan_pools("llama", model, pooled, 32,
                      FixedKnobs({"engine": "tessel", "precision": "fp32"}))[0][0]
    assert [stage.pool for stage in plan.stages] == ["slow", "fast"]
    for engine in ("megatron", "deepspeed", "maxtext", "neuronx"):
        with pytest.raises(Refusal, match="different machines") as refused:
            engine_files(engine, plan, model)
        assert "\n" not in str(refused.value), engine
