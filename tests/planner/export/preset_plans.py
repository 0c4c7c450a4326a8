"""A zoo model's plan on a preset sized to some devices, as the exporters' tests build them."""

from __future__ import annotations

from planner.models.presets import get_preset
from planner.plans.transformer_plan import training_plan
from planner.vocabulary.cluster import Cluster
from planner.vocabulary.parallel import ParallelConfig
from planner.vocabulary.plan import Plan

FULL = {"recompute": "full", "micro_batch_size": 1}
"""Full recomputation, one sequence a micro-batch."""


def plan_of(model: str, cluster_name: str, devices: int, **knobs) -> Plan:
    """`model`'s plan with `knobs` on `devices` of preset `cluster_name`."""
    return training_plan(model, get_preset(model), Cluster.load(cluster_name).with_devices(devices),
                         ParallelConfig.of(**knobs))
