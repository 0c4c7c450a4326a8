"""Pipeline schedules by name, and what each one is: the one list every layer reads (the
Plan's and `ParallelConfig`'s `Schedule` type, the search, the cost models, the exporters
and the runtime).

Each schedule is one row of `SCHEDULE_TABLE`: how many model chunks a rank runs, whether
its ranks hold their chunks in V order, whether it splits backwards into the inputs' and
the weights' gradients, the torch.distributed.pipelining class that runs it, and the
engines that run it. The orders themselves are laid out, action by action, in
`cost_models.pipeline_schedule`; what each name means, with its paper:

- gpipe: every forward, then every backward (Huang et al., "GPipe", NeurIPS 2019).
- 1f1b: PipeDream-Flush (Narayanan et al., "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", SC 2021, Sec. 2.2.1).
- interleaved: interleaved 1F1B, v chunks per rank in loop order (the same paper, Sec.
  2.2.2); with v = 1 Megatron-LM runs it as 1F1B.
- interleaved_zb: interleaved zero bubble (Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024), torch's ScheduleInterleavedZeroBubble.
- zbv: ZB-V (the same paper, Sec. 6), two chunks per rank in V order.
- dualpipev: DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437,
  Sec. 3.2.1, cut in half by Sea AI Lab; deepseek-ai/DualPipe), the same V.

Nothing else of Tessel is imported here: this is the bottom layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Schedule = Literal["gpipe", "1f1b", "interleaved", "dualpipev"]
"""The schedules the planner searches, prices and writes into a Plan."""
RuntimeSchedule = Literal["gpipe", "1f1b", "interleaved", "interleaved_zb", "zbv", "dualpipev"]
"""Every schedule some engine runs: the planner's, and torch's two zero-bubble schedules,
which Tessel's runtime runs but the planner does not offer."""


@dataclass(frozen=True)
class ScheduleInfo:
    """What one pipeline schedule is, as the planner, the cost models and the runtime ask."""

    name: str
    """Tessel's name for it (`RuntimeSchedule`)."""
    chunks: int | None
    """Model chunks (virtual stages) per pipeline rank it needs: that number, or None for
    any number v the plan gives (`virtual_pipeline`)."""
    multi_chunk: bool
    """Whether torch runs it as a multi-stage schedule (`PipelineScheduleMulti`: more than
    one chunk per rank; the interleaved 1F1B with v = 1 runs as single-stage 1F1B)."""
    v_shaped: bool
    """Whether rank r holds chunks r and 2 p - 1 - r (down the V and back up, torch's
    style="v" stage-to-rank mapping) rather than r, r + p, ... (loop order)."""
    zero_bubble: bool
    """Whether it splits some backwards into the inputs' gradient (I, which the previous
    stage waits for) and the weights' (W, which fills bubbles)."""
    torch_class: str
    """The torch.distributed.pipelining class that runs it (TorchTitan's
    `pipeline_parallel_schedule` is this name without "Schedule")."""
    engines: frozenset[str]
    """The engines (`planner.vocabulary.parallel.Engine`) that run it: Megatron-LM runs
    1F1B and interleaved 1F1B only (no GPipe, zero-bubble or DualPipe flag among its
    arguments); TorchTitan runs every torch schedule; Tessel's runtime runs these through
    torch's classes (`runtime.schedule`)."""
    planned: bool
    """Whether the planner searches and prices it (`Schedule`)."""
    laid_out: bool
    """Whether `cost_models.pipeline_schedule` lays its actions out (all but
    interleaved_zb), so that its in-flight micro-batches and timeline can be read off it."""


_ALL = frozenset({"megatron", "torchtitan", "tessel"})
_TORCH = frozenset({"torchtitan", "tessel"})

SCHEDULE_TABLE: dict[str, ScheduleInfo] = {info.name: info for info in (
    ScheduleInfo("gpipe", chunks=1, multi_chunk=False, v_shaped=False, zero_bubble=False,
                 torch_class="ScheduleGPipe", engines=_TORCH, planned=True, laid_out=True),
    ScheduleInfo("1f1b", chunks=1, multi_chunk=False, v_shaped=False, zero_bubble=False,
                 torch_class="Schedule1F1B", engines=_ALL, planned=True, laid_out=True),
    ScheduleInfo("interleaved", chunks=None, multi_chunk=True, v_shaped=False,
                 zero_bubble=False, torch_class="ScheduleInterleaved1F1B", engines=_ALL,
                 planned=True, laid_out=True),
    ScheduleInfo("interleaved_zb", chunks=None, multi_chunk=True, v_shaped=False,
                 zero_bubble=True, torch_class="ScheduleInterleavedZeroBubble",
                 engines=_TORCH, planned=False, laid_out=False),
    ScheduleInfo("zbv", chunks=2, multi_chunk=True, v_shaped=True, zero_bubble=True,
                 torch_class="ScheduleZBVZeroBubble", engines=_TORCH, planned=False,
                 laid_out=True),
    ScheduleInfo("dualpipev", chunks=2, multi_chunk=True, v_shaped=True, zero_bubble=True,
                 torch_class="ScheduleDualPipeV", engines=_TORCH, planned=True,
                 laid_out=True),
)}
"""Every schedule some engine runs, by name, in `RuntimeSchedule`'s order."""

SCHEDULES: tuple[str, ...] = get_args(Schedule)
"""The planner's schedules (CLI choices, validation messages)."""
RUNTIME_SCHEDULES: tuple[str, ...] = get_args(RuntimeSchedule)
"""Every schedule Tessel's runtime runs."""
LAID_OUT: tuple[str, ...] = tuple(n for n, s in SCHEDULE_TABLE.items() if s.laid_out)
"""The schedules `cost_models.pipeline_schedule` lays out: the planner's, and ZB-V."""
MULTI_CHUNK: tuple[str, ...] = tuple(n for n, s in SCHEDULE_TABLE.items() if s.multi_chunk)
"""Schedules that run more than one chunk per rank."""
V_SHAPED: tuple[str, ...] = tuple(n for n, s in SCHEDULE_TABLE.items() if s.v_shaped)
"""Schedules whose rank r holds chunks r and 2 p - 1 - r."""


def schedule_info(name: str) -> ScheduleInfo:
    """The row of `name`, or a ValueError that lists the names."""
    try:
        return SCHEDULE_TABLE[name]
    except KeyError:
        raise ValueError(f"unknown pipeline schedule {name!r}; expected one of "
                         f"{', '.join(SCHEDULE_TABLE)}") from None


def runs_on(name: str, engine: str) -> bool:
    """Whether `engine` runs schedule `name`."""
    return engine in schedule_info(name).engines
