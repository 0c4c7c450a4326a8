"""The search: the Megatron space equals brute force, the auto space is never worse, every
fixed knob stays fixed, and a model too big for the cluster says how many GPUs it needs."""

from __future__ import annotations

import pytest

from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.cluster import Cluster
from planner.models.presets import get_preset, zoo_config
from planner.search import search
from planner.search.megatron_space import best_exhaustive, enumerate_megatron, megatron_stage_splits

# Megatron-LM's 39.1B GPT (Narayanan et al. 2021, Table 1).
GPT3_39B = dict(num_layers=48, hidden_size=8192, num_attention_heads=64, seq_length=2048,
                vocab_size=51200)
CASES = {
    "gpt3-1.3b on 16": (lambda: get_preset("gpt3-1.3b"), 16, 512),
    "gpt3-39b on 64": (lambda: zoo_config("gpt", GPT3_39B), 64, 1536),
}


def a100(gpus: int) -> Cluster:
    return Cluster.load("dgx-a100-80g").with_devices(gpus)


@pytest.mark.parametrize("case", list(CASES))
def test_megatron_space_best_is_the_exhaustive_best(case: str) -> None:
    build, gpus, batch = CASES[case]
    model, cluster = build(), a100(gpus)
    found = search(model, cluster, batch, {}, "megatron")
    brute = best_exhaustive(model, cluster, batch, FixedKnobs())
    assert brute is not None and found.ranked
    best, prediction = found.ranked[0]
    assert prediction.step_time_s == pytest.approx(brute[1].step_time_s, rel=1e-12)
    assert best.parallel == brute[0].parallel
    assert best.layers_per_stage == brute[0].layers_per_stage


def test_megatron_space_holds_every_layout_megatron_can_launch() -> None:
    """Checked apart from the enumerator the search shares: GPT-3 1.3B (16 heads, 24
    layers) on 16 GPUs can run tensor 1-8 within a node and pipeline 1-8 (24 layers over
    16 stages has no split Megatron-LM accepts), with every recomputation mode."""
    candidates = list(enumerate_megatron(get_preset("gpt3-1.3b"), a100(16), 512, FixedKnobs()))
    layouts = {(c.parallel.dims.tensor, c.parallel.dims.pipeline) for c in candidates}
    assert layouts == {(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if t * p <= 16}
    assert {c.parallel.recomputation.recompute for c in candidates} == {"none", "selective", "full"}
    assert {c.parallel.pipelining.schedule for c in candidates} == {"1f1b", "interleaved"}


def test_auto_space_is_never_worse_than_megatron() -> None:
    model, cluster = get_preset("gpt3-1.3b"), a100(16)
    megatron = search(model, cluster, 512, {}, "megatron").ranked[0][1].step_time_s
    auto = search(model, cluster, 512, {}, "auto").ranked[0][1].step_time_s
    assert auto <= megatron


def test_fixed_knobs_are_never_varied() -> None:
    fixed = dict(tensor=2, pipeline=2, recompute="full", micro_batch_size=2)
    result = search(get_preset("gpt3-1.3b"), a100(16), 512, fixed, "megatron")
    assert result.ranked
    for candidate, _ in result.ranked:
        q = candidate.parallel
        d = q.dims
        assert (d.tensor, d.pipeline, q.recomputation.recompute,
                q.batch.micro_batch_size) == (2, 2, "full", 2)


def test_every_ranked_plan_fits_and_ranks_ascend() -> None:
    """Plans whose reserved memory fits come first, each group fastest first."""
    result = search(get_preset("gpt3-13b"), a100(64), 1024, {}, "megatron")
    keys = [(not p.reserved_fits, p.step_time_s) for _, p in result.ranked]
    assert keys == sorted(keys)
    assert all(prediction.fits for _, prediction in result.ranked)


def test_a_plan_whose_reserved_memory_crosses_the_device_ranks_below_those_within() -> None:
    """DeepSeek-V3 in fp8 on 1,024 H100s: plans 4-10% faster than the runner-up reserve
    82-84 GiB of an 80 GB GPU; they follow every plan whose reserved memory fits."""
    from planner.vocabulary.cluster import Cluster

    cluster = Cluster.load("dgx-h100").with_devices(1024)
    result = search(get_preset("deepseek-v3"), cluster, 4096, {"precision": "fp8"}, "megatron")
    flags = [p.reserved_fits for _, p in result.ranked]
    assert flags[0] and False in flags and flags == sorted(flags, reverse=True)
    first_over = flags.index(False)
    assert result.ranked[first_over][1].step_time_s < result.ranked[1][1].step_time_s


def test_uneven_megatron_splits_shrink_first_and_last_stage() -> None:
    assert megatron_stage_splits(96, 8) == [(12,) * 8]
    # 30 layers on 4 stages: middle stages of 8 leave 7 each for the first and last.
    assert (7, 8, 8, 7) in megatron_stage_splits(30, 4)
    assert all(s[0] <= s[1] and s[-1] <= s[1] and sum(s) == 30
               for s in megatron_stage_splits(30, 4))
    assert megatron_stage_splits(31, 2) == []  # two stages cannot be uneven in Megatron-LM


def test_a_model_that_fits_nowhere_says_how_many_gpus_it_needs(capsys) -> None:
    from planner import cli

    # Offload fixed off (the search would otherwise keep the state on the hosts).
    code = cli.main(["gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "8",
                     "--global-batch-size", "64", "--offload-optimizer", "none"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 2
    assert "no plan fits: gpt3-175b does not fit on 8 x A100-SXM4-80GB" in out
    assert "it needs at least 64 GPUs of this kind" in out


def test_a_prime_depth_gives_a_bounded_number_of_uneven_splits() -> None:
    """16381 layers on 3 stages could be split ~11,000 ways; the search tries the few
    closest to even (a deep prime-depth model used to take minutes to plan)."""
    from planner.search.megatron_space import MAX_UNEVEN_SPLITS

    splits = megatron_stage_splits(16381, 3)
    assert 1 <= len(splits) <= MAX_UNEVEN_SPLITS
    assert all(sum(s) == 16381 and s[0] <= s[1] >= s[2] for s in splits)
    assert splits[0] == (5460, 5461, 5460)


@pytest.mark.parametrize("space", ["megatron", "auto"])
def test_every_pipelined_plan_has_a_micro_batch_per_stage(space: str) -> None:
    """Fewer micro-batches than stages never fill a pipeline; torch's schedules, which the
    runtime runs, refuse them. A small batch on many GPUs is where the search met them."""
    cluster = Cluster.load("dgx-a100-80g").with_devices(16)
    ranked = search(get_preset("gpt3-1.3b"), cluster, 16, {}, space).ranked
    assert ranked
    for candidate, _ in ranked:
        stages = len(candidate.stages) if candidate.stages else candidate.parallel.dims.pipeline
        whole = candidate.parallel.batch.micro_batch_size * candidate.parallel.dims.data
        assert stages == 1 or 16 // whole >= stages, candidate


def test_the_megatron_space_on_both_cores_ranks_as_on_one() -> None:
    # A forked child takes layouts from the back while the caller takes them from the
    # front: the same plans, in the same order, ties included.
    from planner.search.megatron_space import search_megatron

    model = get_preset("mixtral-8x7b").model_copy(update={"seq_length": 4096})
    cluster = Cluster.load("dgx-h100").with_devices(64)
    one = search_megatron(model, cluster, 256, FixedKnobs())
    both = search_megatron(model, cluster, 256, FixedKnobs(), both_cores=True)
    assert len(one.ranked) > 1000 and both.evaluated == one.evaluated
    assert both.ranked == one.ranked
