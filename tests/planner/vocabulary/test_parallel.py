"""planner.vocabulary.parallel: knobs by name in their sections, fixed knobs, and the
dualpipev schedule's rules (torch 2.13's ScheduleDualPipeV's: two stages per rank, at least
as many micro-batches as stages)."""

from __future__ import annotations

import pickle

import pytest

from planner.vocabulary.parallel import (
    KNOB_NAMES,
    SCHEDULES,
    SECTION_NAMES,
    SECTION_OF,
    FixedKnobs,
    ParallelConfig,
)
from planner.vocabulary.parallel_dims import ParallelDims


def dualpipev(**knobs) -> ParallelConfig:
    settings = dict(pipeline=4, data=2, virtual_pipeline=2, schedule="dualpipev",
                    global_batch_size=16, engine="torchtitan")
    return ParallelConfig.of(**(settings | knobs))


def test_dualpipev_is_a_schedule_of_two_chunks_per_rank() -> None:
    assert "dualpipev" in SCHEDULES
    resolved = dualpipev().resolve(8)
    assert resolved.num_micro_batches == 8 == 2 * resolved.dims.pipeline
    # Megatron-LM's rule for interleaving (m a multiple of p) is not DualPipeV's: 10
    # micro-batches on 4 ranks run.
    assert dualpipev(global_batch_size=20, engine="megatron").resolve(8).num_micro_batches == 10


@pytest.mark.parametrize(("knobs", "problem"), [
    (dict(pipeline=1, data=8, global_batch_size=32), r"pipeline > 1 \(got 1\)"),
    (dict(virtual_pipeline=1), r"virtual_pipeline 2 \(got 1"),
    (dict(virtual_pipeline=3), r"virtual_pipeline 2 \(got 3"),
    (dict(global_batch_size=14), r"at least 2 x pipeline = 8 micro-batches per step \(got 7\)"),
])
def test_dualpipev_refuses_what_torch_refuses(knobs: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        dualpipev(**knobs).resolve(8)


def test_virtual_stages_still_need_interleaving_or_dualpipev() -> None:
    with pytest.raises(ValueError, match="needs the interleaved schedule"):
        ParallelConfig.of(pipeline=2, virtual_pipeline=2, schedule="1f1b",
                       global_batch_size=8).resolve(2)


def test_fixed_knobs_name_only_knobs_and_none_is_searched() -> None:
    fixed = FixedKnobs(tensor=2, zero_stage=None)
    assert "tensor" in fixed and "zero_stage" not in fixed and fixed.get("zero_stage") is None
    assert fixed.but(tensor=None) == {} and dict(fixed.but(pipeline=4)) == {
        "tensor": 2, "pipeline": 4}
    with pytest.raises(ValueError, match="tensr is no parallel knob"):
        FixedKnobs(tensr=2)


def test_each_knob_is_set_by_name_and_read_where_its_section_holds_it() -> None:
    config = ParallelConfig.of(tensor=4, micro_batch_size=2, recompute="full",
                               moe_token_dispatcher="alltoall", engine="torchtitan")
    assert config.dims == ParallelDims(tensor=4, data=-1)  # data -1 unless given
    assert (config.batch.micro_batch_size, config.recomputation.recompute,
            config.moe.moe_token_dispatcher, config.execution.engine) == (
        2, "full", "alltoall", "torchtitan")
    assert {SECTION_OF[name] for name in KNOB_NAMES} == set(SECTION_NAMES)
    assert all(config.knob(name) == getattr(getattr(config, SECTION_OF[name]), name)
               for name in KNOB_NAMES)
    # A section given whole, then a knob of it: both apply; the rest is unchanged.
    changed = config.but(dims=ParallelDims(pipeline=2), tensor=8, zero_stage=1)
    assert changed.dims == ParallelDims(pipeline=2, tensor=8)
    assert changed.sharding.zero_stage == 1 and changed.batch == config.batch
    assert config.dims.tensor == 4 and config.sharding.zero_stage == 0  # not changed
    with pytest.raises(TypeError, match="tensr is no parallel knob"):
        config.but(tensr=2)


def test_a_configuration_hashes_by_its_knobs_and_pickles_without_its_cached_hash() -> None:
    config = ParallelConfig.of(tensor=2, global_batch_size=8)
    memo = {config: "priced"}
    changed = config.but(tensor=4)  # copied from a configuration whose hash is cached
    assert changed not in memo and changed.but(tensor=2) in memo
    assert hash(changed) == hash(ParallelConfig.of(tensor=4, global_batch_size=8))
    restored = pickle.loads(pickle.dumps(config))
    assert restored == config and "_hash" not in vars(restored)
