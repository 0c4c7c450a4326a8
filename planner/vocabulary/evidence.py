"""How sure a prediction is: the band of measured over predicted step time that the
calibration evidence for its kind of run supports.

A kind of run is an engine (Megatron-LM, TorchTitan, DeepSpeed, Tessel's runtime) x a model
family (dense, MoE, MLA: DeepSeek's multi-latent attention with its experts) x a GPU
generation. Each published run of `../shared/calibration/` was predicted by a fit that did
not see it (leave-one-out, or leave-one-model-out where a model has several rows); the
spread of those held-out errors, per kind, is the band (`planner.evidence` computes it and
writes `planner/presets/evidence.json`; `plan calibration` lists it). A kind with no rows
borrows the nearest kind's band, widened, and says so: a narrow band on a kind of run never
measured would be a wrong answer.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.models.config import TransformerConfig

Family = Literal["dense", "moe", "mla"]
FAMILIES: tuple[Family, ...] = ("dense", "moe", "mla")
EVIDENCE_FILE = Path(__file__).resolve().parent.parent / "presets" / "evidence.json"
GENERATIONS = ("volta", "ampere", "ada", "hopper", "blackwell", "blackwell-ultra")
"""NVIDIA's data-centre generations in order: a kind's nearest evidence is the nearest
generation's. Other devices (AMD, Gaudi, CPUs) are their own generation, far from all."""
# Device names (`DeviceSpec.name`) to their generation: the chips' product names, the
# first match wins (B300 and GB300 are Blackwell Ultra: more fp4, more HBM, other clocks).
_GENERATION_NAMES = (
    ("volta", r"V100"),
    ("ampere", r"A100|A800|A40|A30|A10\b|A6000|RTX 30|RTX 3090"),
    ("ada", r"RTX 40|RTX-40|4090|L40|L4\b|RTX 6000 Ada"),
    ("hopper", r"H100|H200|H800|H20\b|GH200"),
    ("blackwell-ultra", r"B300|GB300|Blackwell.?Ultra"),
    ("blackwell", r"B100|B200|GB200|RTX 50|Blackwell"),
)
_OTHER_GENERATION_NAMES = (
    ("tpu-v5p", r"TPU.?v5p"),
    ("tpu-v6e", r"TPU.?v6e|Trillium"),
    ("tpu-v7", r"TPU.?v?7|Ironwood"),
    ("trainium2", r"Trainium.?2|Trn2\b"),
    ("trainium1", r"Trainium|Trn1\b"),
)
"""Accelerators outside NVIDIA's line whose generations span several device names (a TPU
generation's chip by any of its names; Trainium 1 before Trainium 2, which its pattern
would also match): each is its own generation, far from all (`distance`). Devices named
by neither table (AMD's, Gaudi's, CPUs) are their own generation by their name."""
UNSEEN_WIDENING = 2.0
"""How much wider (in log space, each side) the band of a kind with no published run is
than its nearest measured kind's: an unmeasured kind is assumed twice as uncertain."""
ENGINE_NAMES = {"megatron": "Megatron-LM", "torchtitan": "TorchTitan", "deepspeed": "DeepSpeed",
                "tessel": "Tessel's runtime"}


class Band(BaseModel):
    """The band of one kind of run, and the evidence it rests on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str = Field(description="The engine the runs ran on (megatron, torchtitan, ...).")
    family: str = Field(description="Model family: dense, moe or mla.")
    generation: str = Field(description="GPU generation (ampere, hopper, blackwell, ...).")
    low: float = Field(gt=0, description="Measured over predicted step time, low end.")
    high: float = Field(gt=0, description="Measured over predicted step time, high end.")
    rows: int = Field(ge=0, description="Published runs of this kind that the band rests on "
                      "(0: borrowed from `borrowed_from`).")
    method: str = Field(description="How the band was drawn from the rows' held-out errors.")
    held_out: str = Field(default="", description="How each row was held out from the fit "
                          "that predicted it, in words.")
    borrowed_from: str | None = Field(default=None, description="The measured kind a kind "
                                      "without rows takes its band from, widened.")

    @property
    def kind(self) -> str:
        """'Megatron-LM, MoE on Blackwell'."""
        return kind_words(self.engine, self.family, self.generation)

    def words(self) -> str:
        """One line: where the band comes from ('TorchTitan, dense on Hopper: 2 published
        runs, held out one at a time; -9%/+12%')."""
        span = f"{(self.low - 1) * 100:+.0f}%/{(self.high - 1) * 100:+.0f}%"
        if self.rows == 0:
            return f"{self.kind}: no published run; {span}, {self.method}"
        runs = "published run" if self.rows == 1 else "published runs"
        return f"{self.kind}: {self.rows:,} {runs}, {self.held_out}; {span} ({self.method})"


def kind_words(engine: str, family: str, generation: str) -> str:
    """'Megatron-LM, MoE on Blackwell'."""
    what = {"dense": "dense", "moe": "MoE", "mla": "MLA+MoE"}.get(family, family)
    where = generation.replace("-", " ").title() if generation in GENERATIONS else generation
    return f"{ENGINE_NAMES.get(engine, engine)}, {what} on {where}"


def family_of(model: TransformerConfig | None) -> Family:
    """A model's family: MLA (DeepSeek's attention, with experts), MoE, or dense (a traced
    module, `None`, is priced as dense)."""
    if model is None:
        return "dense"
    if model.multi_latent_attention:
        return "mla"
    return "moe" if model.is_moe else "dense"


def generation_of(device_name: str) -> str:
    """The GPU generation of a device by its name ('H100-SXM5-80GB' -> 'hopper'); TPU and
    Trainium chips by their generation ('TPU7x-Ironwood' -> 'tpu-v7'); other devices are
    their own ('MI300X-192GB' -> 'mi300x-192gb')."""
    for generation, pattern in _GENERATION_NAMES + _OTHER_GENERATION_NAMES:
        if re.search(pattern, device_name, re.IGNORECASE):
            return generation
    return device_name.lower()


@cache
def shipped_bands(path: Path = EVIDENCE_FILE) -> tuple[Band, ...]:
    """The bands of every kind with published runs, as `planner.evidence` wrote them."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return tuple(Band(**band) for band in data["bands"])


def band_for(engine: str, family: str, generation: str,
             bands: tuple[Band, ...] | None = None) -> Band:
    """The band of a kind of run: its own if it has published runs, else the nearest
    measured kind's (`distance`) widened `UNSEEN_WIDENING` times each side, in log space."""
    bands = shipped_bands() if bands is None else bands
    for band in bands:
        if (band.engine, band.family, band.generation) == (engine, family, generation):
            return band
    nearest = min(bands, key=lambda b: (distance(b, engine, family, generation), -b.rows))
    return Band(engine=engine, family=family, generation=generation,
                low=nearest.low ** UNSEEN_WIDENING, high=nearest.high ** UNSEEN_WIDENING,
                rows=0, borrowed_from=nearest.kind,
                method=f"the band of {nearest.kind} ({nearest.rows:,} runs) widened "
                f"{UNSEEN_WIDENING:g}x")


def distance(band: Band, engine: str, family: str, generation: str) -> float:
    """How far a measured kind is from the kind asked for: another engine prices the same
    layers differently (2), another family has other kernels (MoE and MLA+MoE, which share
    the experts, 1; dense and either, 2), and each generation apart changes the kernels'
    efficiency (1; a device outside NVIDIA's line is 3 from every one)."""
    far = 0.0 if band.engine == engine else 2.0
    if band.family != family:
        far += 1.0 if {band.family, family} == {"moe", "mla"} else 2.0
    if band.generation != generation:
        if band.generation in GENERATIONS and generation in GENERATIONS:
            far += abs(GENERATIONS.index(band.generation) - GENERATIONS.index(generation))
        else:
            far += 3.0
    return far


UNCALIBRATED = (0.8, 1.5)
"""The least a band spans on a device whose efficiency was fitted to nothing (a cluster
file's own device, or a preset with typical values): analytical models before calibration
erred by 20-50% on published Megatron-LM runs (Tessel's own, mostly optimistic), so the
band is wide and leans towards slower than predicted."""


FINETUNE_OFFLOAD = (0.85, 1.40)
"""Measured over predicted step time of the published fine-tuning and offload runs
(`benchmarks/finetune_accuracy.py`: torchtune's full fine-tune with a paged 8-bit Adam,
LoRA and QLoRA on an RTX 4090 and its 70B full fine-tune with CPU offload,
Megatron-Bridge's 70B SFT and LoRA, DeepSpeed's ZeRO-3 offload at 1,024 A100; the adapter
rows held out of the one fit) and of the bars of DeepSpeed's Figure 5 held out beside them
(175B with ZeRO-3 and CPU offload at 1 to 32 sequences a GPU on 128 to 1,024 A100, up to
1.39 at one sequence a GPU): the least a band spans for a plan that offloads or trains
adapters, whose mechanisms the pre-training runs of its kind never measured.
tests/planner/vocabulary/test_evidence.py holds it to those runs."""


def prediction_band(engine: str, model: TransformerConfig | None, device_name: str,
                    calibrated: bool, bands: tuple[Band, ...] | None = None,
                    offload_or_adapters: bool = False) -> Band:
    """The band of a prediction for `model` (None: a traced module) run by `engine` on a
    device named `device_name`; `calibrated`: whether the device's efficiency was fitted
    (`DeviceSpec.calibration`). A device with typical efficiency is priced with numbers no
    published run checked: its kind counts as unmeasured, and its band spans at least
    `UNCALIBRATED`. A plan that offloads or trains adapters (`offload_or_adapters`) spans
    at least `FINETUNE_OFFLOAD`, the fine-tuning and offload runs' errors."""
    band = band_for(engine, family_of(model), generation_of(device_name), bands)
    if offload_or_adapters:
        low, high = min(band.low, FINETUNE_OFFLOAD[0]), max(band.high, FINETUNE_OFFLOAD[1])
        if (low, high) != (band.low, band.high):
            band = band.model_copy(update={
                "low": low, "high": high,
                "method": f"{band.method}, widened for offload or adapters to what the "
                          "published fine-tuning and offload runs span "
                          "(benchmarks/finetune_accuracy.py)"})
    if calibrated:
        return band
    return band.model_copy(update={
        "low": min(band.low, UNCALIBRATED[0]), "high": max(band.high, UNCALIBRATED[1]),
        "rows": 0, "borrowed_from": band.borrowed_from if band.borrowed_from else band.kind,
        "method": f"the device's efficiency is typical values, fitted to no run: at least "
                  f"{(UNCALIBRATED[0] - 1) * 100:+.0f}%/{(UNCALIBRATED[1] - 1) * 100:+.0f}%, "
                  f"else {band.method if band.rows == 0 else 'the band of ' + band.kind}"})
