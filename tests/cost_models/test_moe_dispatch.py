"""MoE pricing: dispatch by mechanism, load imbalance, kinds of layers, and the published
MoE runs it was fitted to."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from cost_models.layer_mix import layer_variants
from cost_models.efficiency_fit import MeasuredStep
from cost_models.moe_calibration import (
    MOE_RUNS,
    MoeRun,
    bridge_scale_up_domain,
    predicted_throughput,
    read_moe_runs,
    run_cluster,
)
from cost_models.engine_memory import loss_bytes
from cost_models.moe_dispatch import (
    LayerSlots,
    SlotCompute,
    expected_load,
    overlapped_layer_seconds,
    remote_nodes_per_token,
)
from cost_models.saved_activations import _expert_rows_kept, saved_per_layer
from cost_models.published_memory import CALIBRATION
from cost_models.step_time import predict_step
from cost_models.transformer_ops import (
    Matmul,
    forward_flops,
    layer_ops,
    projections,
    recomputed_kernels,
)
from planner.vocabulary.cluster import Cluster
from planner.models.config import LayerKind
from planner.models.presets import PRESETS
from planner.vocabulary.parallel import ParallelConfig



def test_forced_balance_is_exact_and_random_routing_follows_raab_steger() -> None:
    even = ParallelConfig.of(moe_router_force_load_balancing=True)
    assert expected_load(16384, 32, even) == 1.0
    # m/n + sqrt(2 m ln n / n) over m/n, for m/n = 16384 rows per rank on 32 ranks.
    assert expected_load(16384, 32, ParallelConfig()) == pytest.approx(
        1 + math.sqrt(2 * math.log(32) / 16384))
    capped = ParallelConfig.of(moe_expert_capacity_factor=1.01)
    assert expected_load(100, 32, capped) == 1.01


@pytest.mark.parametrize("experts, nodes, k, groups, group_topk", [
    (8, 4, 2, None, None), (16, 4, 3, None, None), (16, 4, 4, 4, 2), (12, 2, 2, None, None)])
def test_remote_nodes_per_token_is_the_count_over_every_choice_of_experts(
        experts: int, nodes: int, k: int, groups: int | None, group_topk: int | None) -> None:
    """Brute force: the router picks group_topk groups (one group per node), then k
    experts among theirs (DeepSeek-V3's node-limited routing); every choice equally
    likely; nodes other than the token's own, averaged over the token's node."""
    model = PRESETS["mixtral-8x7b"].model_copy(update={
        "num_experts": experts, "moe_top_k": k, "moe_router_num_groups": groups,
        "moe_router_group_topk": group_topk})
    per_node = experts // nodes
    node_of = [e // per_node for e in range(experts)]
    picks = itertools.combinations(range(nodes), group_topk) if groups else [range(nodes)]
    counts = []
    for picked in picks:
        pool = [e for e in range(experts) if node_of[e] in picked]
        for chosen in itertools.combinations(pool, k):
            used = {node_of[e] for e in chosen}
            counts.append(sum(len(used - {home}) for home in range(nodes)) / nodes)
    assert remote_nodes_per_token(model, nodes) == pytest.approx(sum(counts) / len(counts))


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b",
                                  "mixtral-8x22b"])
def test_each_kind_of_layer_multiplies_its_active_weights_once_per_token(name: str) -> None:
    """A token's projection FLOPs are 2 x the weights it passes through: MLA's latent
    projections, the router, its top-k experts and the shared expert (biases, norms and
    sinks aside)."""
    model = PRESETS[name].model_copy(update={"bias": False, "qk_layernorm": False,
                                             "softmax_type": "vanilla"})
    for kind in set(model.layer_kinds()):
        layer = model.for_layer(kind)
        ops = layer_ops(layer, 1, 1, 1, False)
        weights = model.layer_parameters(kind) - 2 * model.hidden_size
        if model.multi_latent_attention:
            weights -= (model.q_lora_rank or 0) + model.kv_lora_rank  # latent norms
        if kind.moe:
            experts = model.layer_expert_parameters(kind)
            weights -= experts * (1 - model.moe_top_k / model.num_experts)
        assert forward_flops(projections(ops)) == pytest.approx(2 * weights)


def test_a_stage_of_mixed_layers_is_priced_at_the_mean_layer() -> None:
    model = PRESETS["deepseek-v3"]
    variants = layer_variants(model)
    assert [(v.layer_kinds()[0], share) for v, share in variants] == [
        (LayerKind(moe=False), 3 / 61), (LayerKind(moe=True), 58 / 61)]
    assert layer_variants(PRESETS["llama3-8b"]) == [(PRESETS["llama3-8b"], 1.0)]


def test_recompute_modules_replay_their_own_kernels() -> None:
    ops = layer_ops(PRESETS["deepseek-v3"].for_layer(LayerKind(moe=True)), 1, 4096, 1, False)
    assert {op.name for op in recomputed_kernels(ops, ("mla_up_proj",))} == {
        "q up", "kv up", "rotary join"}
    assert {op.name for op in recomputed_kernels(ops, ("moe_act",))} == {"expert activation"}
    assert recomputed_kernels(ops, ("mlp",)) == []  # an MoE layer has no dense MLP


def test_experts_folded_apart_from_attention_split_the_same_work() -> None:
    """Qwen3-235B's layout (t2, expert tensor 1, ep 32 over 256 H100s): the expert GEMMs
    of a rank hold half the tokens at the whole expert width, as many FLOPs as expert
    tensor 2 would run."""
    model, h100 = PRESETS["qwen3-235b-a22b"], Cluster.load("dgx-h100").with_devices(256)
    folded = ParallelConfig.of(tensor=2, sequence_parallel=True, pipeline=8, expert=32,
                            expert_tensor=1, global_batch_size=1024,
                            moe_router_force_load_balancing=True)
    split = predict_step(model, h100, folded)
    assert split.fits
    with pytest.raises(ValueError, match=r"expert \(32\) x expert_tensor \(2\) must divide"):
        folded_t2 = folded.but(expert_tensor=None)
        folded_t2.resolve(256)
    experts = [op for op in layer_ops(model, 1, 4096, 2, True) if isinstance(op, Matmul)
               and op.name.startswith("expert")]
    assert sum(op.flops for op in experts) == pytest.approx(
        2 * 4096 * model.moe_top_k * 3 * model.hidden_size * model.expert_ffn_size / 2)


def test_published_moe_runs_are_predicted_within_15_percent() -> None:
    """Megatron-Bridge's DeepSeek-V3, Qwen3-235B and GPT-OSS-120B runs, with the MoE
    parameters the presets ship (fitted to these four rows and the two recipe lines:
    tests/planner/megatron/test_recipe_runs.py checks all six)."""
    runs = read_moe_runs(CALIBRATION / MOE_RUNS)
    predicted = predicted_throughput(runs)
    for run, tokens in zip(runs, predicted):
        assert tokens == pytest.approx(run.tokens_per_gpu_s, rel=0.15), run.step.label


@pytest.mark.parametrize(("preset", "gpus", "domain"), [
    ("gb200-nvl72", 256, 64),     # 64 nodes: four segments of 16 trays
    ("gb200-nvl72", 1152, 72),    # 288 nodes: segments of 18, whole racks
    ("gb200-nvl72", 80, 40),      # 20 nodes: 18 and 19 do not divide them, 10 does
    ("gb200-nvl72", 64, None),    # 16 nodes: one segment, the part-filled rack
    ("dgx-h100", 256, None),      # no NVL72 racks to segment
])
def test_bridge_places_gb200_jobs_in_slurm_segments_of_whole_trays(
        preset: str, gpus: int, domain: int | None) -> None:
    """Megatron-Bridge's launcher asks Slurm for segments of up to 18 GB200 nodes
    (scripts/performance/utils/executors.py): the NVLink domain a job's ranks share."""
    assert bridge_scale_up_domain(preset, gpus) == domain


def test_an_expert_group_inside_a_segment_stays_on_nvlink() -> None:
    """Qwen3-235B-A22B on 256 GB200 with ep 32: in racks of 64 no expert group crosses
    InfiniBand; in racks of 72 one straddles two, and its dispatch is slower."""
    parallel = ParallelConfig.of(tensor=1, pipeline=8, expert=32, micro_batch_size=1,
                                 global_batch_size=8192, moe_token_dispatcher="alltoall",
                                 moe_router_force_load_balancing=True)
    step = MeasuredStep(model=PRESETS["qwen3-235b-a22b"], parallel=parallel, num_gpus=256,
                        seconds=1.0, label="qwen3")
    segmented = MoeRun(step=step, preset="gb200-nvl72", tokens_per_gpu_s=1.0, notes="",
                       scale_up_domain=64)
    racks = replace(segmented, scale_up_domain=None)
    assert not run_cluster(segmented).spans_domains(1, 32)
    assert run_cluster(racks).spans_domains(1, 32)
    fast, slow = predicted_throughput([segmented, racks])
    assert fast > slow


def test_attention_sinks_run_at_their_own_efficiency() -> None:
    """GPT-OSS's learnable softmax prices its attention at `sink_attention` x the fused
    rate; a model of vanilla softmax is untouched."""
    sized = Cluster.load("dgx-h100").with_devices(64)
    config = ParallelConfig.of(tensor=1, pipeline=4, expert=8, micro_batch_size=1,
                               global_batch_size=1280, moe_token_dispatcher="alltoall",
                               moe_router_force_load_balancing=True)
    for name, changes in (("gpt-oss-120b", True), ("qwen3-30b-a3b", False)):
        model = PRESETS[name]

        def step(sink: float) -> float:
            efficiency = sized.device.efficiency.model_copy(update={"sink_attention": sink})
            return predict_step(model, sized.with_efficiency(efficiency),
                                config).step_time_s

        assert (step(0.5) > step(1.0)) == changes, name


# -- the all-to-all overlap's schedule, delayed weight gradients, the paged stash --------

def _slots(forward: float, input_grads: float, weight_grads: float) -> LayerSlots:
    slot = SlotCompute(forward, input_grads, weight_grads)
    return LayerSlots(attention=slot, experts=slot)


def test_the_overlapped_schedule_is_bound_by_its_streams() -> None:
    """Four all-to-alls of 10 s beside no compute: the communication stream, 40 s a
    layer; no communication: the compute, 6 s."""
    assert overlapped_layer_seconds(10.0, _slots(0.0, 0.0, 0.0), False) == pytest.approx(40.0)
    assert overlapped_layer_seconds(0.0, _slots(1.0, 1.0, 1.0), True) == pytest.approx(6.0)


def test_delayed_weight_gradients_hide_what_waited_for_them() -> None:
    """Each slot 1 s forward, 1 s input gradients, 1 s weight gradients; all-to-alls of
    1.5 s (6 s of communication beside 6 s of compute). By hand, layer after layer
    (TransformerLayerSchedulePlan.run's order): without delay the backward dispatch waits
    for the experts' whole backward (3.5 s in) and the attention's backward follows it, so
    a layer takes 7 s; delayed, it waits for their input gradients only (2.5 s in), the
    weight gradients run beneath it, and a layer takes the 6 s of its compute."""
    slots = _slots(1.0, 1.0, 1.0)
    assert overlapped_layer_seconds(1.5, slots, False) == pytest.approx(7.0)
    assert overlapped_layer_seconds(1.5, slots, True) == pytest.approx(6.0)


def test_delayed_weight_gradients_speed_up_deepseek_v3s_overlap_on_b200() -> None:
    """The published DeepSeek-V3 run on 256 B200 (DeepEP, all-to-all overlap): its
    all-to-alls and compute are about even, so delaying the weight gradients shortens the
    step; without the overlap each all-to-all is exposed whole."""
    run = next(r for r in read_moe_runs(CALIBRATION / MOE_RUNS)
               if r.step.label == "DeepSeek-V3 B200").step
    cluster = Cluster.load("dgx-b200").with_devices(run.num_gpus)

    def step(**knobs: object) -> float:
        return predict_step(run.model, cluster, run.parallel.but(**knobs)).step_time_s

    delayed, waiting = step(delay_wgrad_compute=True), step(delay_wgrad_compute=False)
    exposed = step(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)
    assert delayed < waiting < exposed


def test_the_paged_stash_keeps_its_buffer_not_the_padded_capacity() -> None:
    """Expert inputs padded to a capacity of 1.5 keep 1.5 x the even share of rows; a
    paged stash of factor 1.2 keeps 1.2 x (paged_stash.py, allocate_stash_buffers: the
    factor over the expected tokens); a negative factor scales the padded rows."""
    padded = ParallelConfig.of(moe_expert_capacity_factor=1.5,
                               moe_pad_expert_input_to_capacity=True).moe
    assert _expert_rows_kept(padded) == 1.5
    assert _expert_rows_kept(replace(padded, moe_paged_stash=True,
                                     moe_paged_stash_buffer_factor=1.2)) == 1.2
    assert _expert_rows_kept(replace(padded, moe_paged_stash=True,
                                     moe_paged_stash_buffer_factor=-1.0)) == 1.5
    model = PRESETS["gpt-oss-120b"]
    config = ParallelConfig.of(expert=8, moe_expert_capacity_factor=1.5,
                               moe_pad_expert_input_to_capacity=True,
                               moe_token_dispatcher="alltoall")
    kept = sum(saved_per_layer(model.for_layer(LayerKind(moe=True)), config, True).values())
    stashed = sum(saved_per_layer(model.for_layer(LayerKind(moe=True)),
                                  config.but(moe_paged_stash=True,
                                             moe_paged_stash_buffer_factor=1.2),
                                  True).values())
    assert stashed < kept


def test_hybridep_rank_budget_sizes_the_kept_rows_and_the_stash_undercuts_it() -> None:
    """--moe-expert-rank-capacity-factor 1.5 (token_dispatcher.py: num_permuted_tokens =
    tokens x top-k x 1.5) keeps 1.5 x the even share; the recipes' paged stash of 1.2 keeps
    1.2 x, the saving their full-iteration graphs are after."""
    budget = ParallelConfig.of(moe_expert_rank_capacity_factor=1.5).moe
    assert _expert_rows_kept(budget) == 1.5
    assert _expert_rows_kept(replace(budget, moe_paged_stash=True,
                                     moe_paged_stash_buffer_factor=1.2)) == 1.2
    assert _expert_rows_kept(ParallelConfig.of().moe) == 1.0


def test_the_fp8_output_projection_keeps_an_mxfp8_input() -> None:
    """--fp8-output-proj: the head's saved input is MXFP8, 1 byte and 1/32 of a scale per
    element, not 2 (bf16): for Llama 3 8B's 4096 x 4096 micro-batch, 4096 x 4096 x
    (2 - 33/32) bytes fewer."""
    model = PRESETS["llama3-8b"].model_copy(update={"seq_length": 4096})
    fp8 = ParallelConfig.of(precision="fp8", fp8_recipe="mxfp8")
    bf16_input, _ = loss_bytes(model, fp8)
    fp8_input, _ = loss_bytes(model, fp8.but(fp8_output_proj=True))
    assert bf16_input - fp8_input == pytest.approx(4096 * 4096 * (2 - 33 / 32))
