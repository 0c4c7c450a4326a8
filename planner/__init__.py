"""Tessel: plan and run parallel training for PyTorch models.

`plan_model` plans a model's training step over a device mesh, `plan_graph` over a cluster
(pipeline stages, each sharded on its own submesh); `parallelize` plans it and returns a
trainer for the ranks of an initialized process group; `GraphKnobs` fixes a graph plan's
recomputation, schedule or ZeRO-3. `plan_training` plans a transformer given by its shape
(`planner.models.config.TransformerConfig`) on a cluster, as `plan MODEL --gpus N` does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GraphKnobs", "parallelize", "plan_graph", "plan_model", "plan_training"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `planner.vocabulary.cluster` and the CLI's error paths stay light.
    if name == "GraphKnobs":
        from planner.search.graph_knobs import GraphKnobs

        return GraphKnobs
    if name == "plan_training":
        from planner.plans.transformer_plan import plan_training

        return plan_training
    if name in __all__:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
