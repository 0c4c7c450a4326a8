"""planner.vocabulary.schedules: one list of schedule names and one capability table,
which torch, the Plan's type, the schedule layouts and the runtime agree with."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest
from torch.distributed import pipelining
from torch.distributed.pipelining.schedules import PipelineScheduleMulti

from cost_models.pipeline_schedule import rank_actions, stage_rank
from planner.vocabulary.parallel import ENGINES, SCHEDULES, Pipelining
from planner.vocabulary.schedules import (
    LAID_OUT,
    MULTI_CHUNK,
    RUNTIME_SCHEDULES,
    SCHEDULE_TABLE,
    V_SHAPED,
    Schedule,
    runs_on,
    schedule_info,
)
from runtime.schedule import SCHEDULE_CLASSES


def test_the_table_lists_every_runtime_schedule_once_and_the_planner_s_among_them() -> None:
    assert tuple(SCHEDULE_TABLE) == RUNTIME_SCHEDULES
    assert SCHEDULES == get_args(Schedule) == tuple(
        name for name, info in SCHEDULE_TABLE.items() if info.planned)
    # The config's field is the same Literal: dataclass and pydantic typing keep working.
    assert Pipelining.__dataclass_fields__["schedule"].type in ("Schedule", Schedule)
    assert all(info.engines <= set(ENGINES) for info in SCHEDULE_TABLE.values())


def test_each_row_is_what_torch_s_class_is() -> None:
    for name, info in SCHEDULE_TABLE.items():
        cls = getattr(pipelining, info.torch_class)
        assert SCHEDULE_CLASSES[name] is cls
        assert issubclass(cls, PipelineScheduleMulti) == info.multi_chunk, name
        assert info.chunks in ((2,) if info.v_shaped else (1,) if not info.multi_chunk
                               else (None,)), name
    assert MULTI_CHUNK == ("interleaved", "interleaved_zb", "zbv", "dualpipev")
    assert V_SHAPED == ("zbv", "dualpipev")


def test_the_laid_out_schedules_are_what_pipeline_schedule_lays_out() -> None:
    assert LAID_OUT == (*SCHEDULES[:3], "zbv", "dualpipev")
    for name in RUNTIME_SCHEDULES:
        info = schedule_info(name)
        if not info.laid_out:
            with pytest.raises(ValueError, match="unknown pipeline schedule"):
                rank_actions(name, 2, 0, 4, 2)
            continue
        v = info.chunks or 2
        actions = rank_actions(name, 2, 0, 4, v)
        # Rank 0 of 2 holds stages 0 and 3 in V order, 0 and 2 in loop order.
        held = sorted({a.stage for a in actions})
        assert held == ([0, 3] if info.v_shaped else [0, 2] if v == 2 else [0]), name
        assert stage_rank(3, 2, name) == (0 if info.v_shaped else 1)


def test_engines_run_what_they_run() -> None:
    assert [s for s in SCHEDULES if runs_on(s, "megatron")] == ["1f1b", "interleaved"]
    assert all(runs_on(s, "torchtitan") and runs_on(s, "tessel") for s in RUNTIME_SCHEDULES)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zigzag'"):
        schedule_info("zigzag")


def test_the_vocabulary_imports_nothing_above_it() -> None:
    code = ("import sys, planner.vocabulary.schedules; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('cost_models', 'passes', 'runtime', 'torch') or m.startswith('planner.search')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
