"""The search under engine "torchtitan" (fixed {"engine": "torchtitan"}): it prices only
what TorchTitan runs, so every plan it finds exports to a job config that predicts as the
plan did (tests/planner/cli/test_predict_torchtitan.py reads them back)."""

from __future__ import annotations

import pytest

from planner.vocabulary.parallel import FixedKnobs
from planner.vocabulary.cluster import Cluster
from planner.search.knobs import check_knobs
from planner.models.presets import get_preset
from planner.search.megatron_space import enumerate_megatron, search_megatron
from planner.torchtitan.rules import zero_stages

MODEL = get_preset("llama3-8b")


def test_every_candidate_is_what_torchtitan_runs() -> None:
    cluster = Cluster.load("dgx-h100").with_devices(32)
    seen = set()
    for fixed in ({"engine": "torchtitan"},
                  {"engine": "torchtitan", "compile": True, "precision": "fp8",
                   "fp8_param_gather": True}):
        for candidate in enumerate_megatron(MODEL, cluster, 64, fixed):
            q = candidate.parallel
            assert q.execution.engine == "torchtitan"
            dims = q.dims
            assert q.sharding.zero_stage in zero_stages(dims.tensor, dims.context, dims.pipeline,
                                                        dims.data)
            assert q.sharding.sequence_parallel == (q.dims.tensor > 1)
            assert q.numerics.fp8_recipe == "tensorwise"
            # async TP is a compile pass
            assert not q.overlap.tp_comm_overlap or q.execution.compile
            zero3 = q.sharding.zero_stage == 3
            assert not q.numerics.fp8_param_gather or (zero3 and q.dims.data > 1)
            seen.add((q.sharding.zero_stage, q.overlap.tp_comm_overlap,
                      q.numerics.fp8_param_gather, q.execution.compile))
    # DDP and FSDP both tried; async TP and fp8 gathers where compile and fp8 allow them.
    assert {(0, False, False, False), (3, False, False, False), (3, True, True, True)} <= seen


def test_megatrons_search_is_unchanged_by_the_engine_knobs() -> None:
    cluster = Cluster.load("dgx-h100").with_devices(16)
    for candidate in enumerate_megatron(MODEL, cluster, 64, FixedKnobs()):
        q = candidate.parallel
        assert q.execution.engine == "megatron" and q.sharding.zero_stage in (0, 1)
        assert (q.sharding.fsdp_reshard_after_forward, q.recomputation.recompute_every,
                q.execution.compile,
                q.numerics.fp8_param_gather, q.numerics.fp8_recipe) == ("default", 1, False, False,
                                                                        "delayed")


def test_the_best_torchtitan_plan_is_priced_as_torchtitan_runs_it() -> None:
    cluster = Cluster.load("dgx-h100").with_devices(16)
    result = search_megatron(MODEL, cluster, 64,
                             FixedKnobs(engine="torchtitan", precision="bf16"))
    assert result.ranked
    for candidate, prediction in result.ranked[:5]:
        assert candidate.parallel.execution.engine == "torchtitan" and prediction.fits


def test_fsdp_is_in_the_megatron_space_under_torchtitan() -> None:
    cluster = Cluster.load("dgx-h100").with_devices(16)
    check_knobs(FixedKnobs(zero_stage=3, engine="torchtitan"), MODEL, cluster, 64, "megatron")
    with pytest.raises(ValueError, match="--zero-stage 3 is not in --space megatron"):
        check_knobs(FixedKnobs({"zero_stage": 3}), MODEL, cluster, 64, "megatron")
