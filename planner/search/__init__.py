"""The search: which parallel plan to run.

- `megatron_space`: the layouts Megatron-LM runs (one mesh for every stage), searched
  exhaustively with pruning; `alpa_space`: Alpa's, stages that differ in layers and mesh,
  chosen by the stage DP of `inter_op` for each setting of the knobs all stages share.
- `intra_op` builds Alpa's operator-sharding ILP over DTensor's strategies, `solver`
  solves it, `buckets` groups gradient reductions, `stage_ilp` prices a transformer
  block's tensor-parallel collectives with that ILP (for `search(..., collectives=...)`).
- `graph_space`: Alpa for any traced model (and for zoo and hf: transformers under
  `plan --intra-op ilp`): `layer_table` solves each layer on every logical mesh,
  `stage_costs` prices every stage from it for the stage DP, `graph_prediction` predicts a
  layout exactly, its stages solved whole (`stage_solve`) or run as their layers' programs
  (`layered_stage`).

`search` is the entry point of the training-plan search. Modules import one way:
alpa_space -> megatron_space, stage_ilp -> intra_op -> solver, buckets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.vocabulary.parallel import OFFLOAD_KNOBS, FixedKnobs

if TYPE_CHECKING:
    from cost_models.layer_collectives import LayerCollectives
    from planner.vocabulary.cluster import Cluster
    from planner.models.config import TransformerConfig
    from planner.search.megatron_space import Progress, SearchResult, SearchSpace

__all__ = ["search"]


def search(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    space: SearchSpace = "auto", progress: Progress | None = None,
    flash_attention: bool | None = None, collectives: LayerCollectives | None = None,
) -> SearchResult:
    """The best configurations in `space` ("megatron" or "auto"; the Megatron space under
    the torchtitan engine and for mixtures of experts), best first; the knobs in `fixed`
    are kept by every one. With `collectives`, layers are charged the tensor-parallel
    collectives the intra-op ILP chose for them (`stage_ilp`) instead of Megatron-LM's.
    Unless `fixed` names a precision, plans use the device's default (bf16, fp16 on a
    device without it, fp32 on a CPU), and attention is priced fused where the device
    runs fused attention, unless `flash_attention` says."""
    fixed = FixedKnobs({"precision": cluster.device.default_precision, **fixed})
    if flash_attention is None:  # as the device runs attention
        flash_attention = cluster.device.flash_attention
    result = _search_space(model, cluster, gbs, fixed, space, progress, flash_attention,
                           collectives)
    if result.ranked or not offload_candidates(cluster, fixed):
        return result
    from planner.search.megatron_space import rank_key

    # Nothing fits on the GPUs: the same space with state kept off them, each offload
    # setting searched whole and the plans of all ranked together, so that more offload
    # wins where the memory it frees buys a faster layout (less recomputation, fewer
    # pipeline stages) than its transfers cost. Offload given as knobs is never varied.
    for offload in offload_candidates(cluster, fixed):
        tried = _search_space(model, cluster, gbs, fixed.but(**offload), space, progress,
                              flash_attention, collectives)
        result.evaluated += tried.evaluated
        for phase, seconds in tried.timings.items():
            result.timings[phase] = result.timings.get(phase, 0.0) + seconds
        result.ranked += tried.ranked
    result.ranked.sort(key=lambda item: rank_key(item[1]))
    return result


OFFLOAD_SETTINGS: tuple[dict[str, str | int], ...] = (
    {"offload_optimizer": "cpu"},
    {"offload_optimizer": "cpu", "offload_params": "cpu", "zero_stage": 3},
    {"offload_optimizer": "nvme", "offload_params": "cpu", "zero_stage": 3},
    {"offload_optimizer": "cpu", "offload_params": "nvme", "zero_stage": 3},
    {"offload_optimizer": "nvme", "offload_params": "nvme", "zero_stage": 3},
)
"""Offload the search tries when nothing fits: the optimizer's state to the host
(ZeRO-Offload), ZeRO-3's parameters too (ZeRO-Infinity), NVMe for either or both where the
host's memory is short."""


def offload_candidates(cluster: Cluster, fixed: FixedKnobs) -> list[dict[str, str | int]]:
    """The offload settings `search` tries when nothing fits: `OFFLOAD_SETTINGS` the cluster
    can hold (NVMe only with its figures) and the fixed knobs allow; none where offload is
    fixed, the cluster has no host figures, or the engine does not offload (Megatron-LM
    moves only the optimizer's state, to the CPU)."""
    # (Activations offloaded as a knob still leave the state's offload to the search.)
    if cluster.host is None or (OFFLOAD_KNOBS - {"offload_activation_layers"}) & set(fixed):
        return []
    nvme = cluster.host.nvme_read_gbs is not None and cluster.host.nvme_write_gbs is not None
    settings = []
    for setting in OFFLOAD_SETTINGS:
        if "nvme" in setting.values() and not nvme:
            continue
        if "zero_stage" in setting and fixed.get("zero_stage", 3) != setting["zero_stage"]:
            continue
        if fixed.get("engine") in ("megatron", "torchtitan") and "offload_params" in setting:
            continue  # parameters offload is DeepSpeed's ZeRO-Infinity (and FSDP2's CPU
            # offload, which TorchTitan runs only with the optimizer's, both to the CPU)
        settings.append(setting)
    return settings


def _search_space(
    model: TransformerConfig, cluster: Cluster, gbs: int, fixed: FixedKnobs,
    space: SearchSpace, progress: Progress | None, flash_attention: bool,
    collectives: LayerCollectives | None,
) -> SearchResult:
    """`search` in one space, with the knobs `fixed`."""
    # TorchTitan, like Megatron-LM, runs every stage on one mesh: Alpa's stages of meshes of
    # their own are not plans it can run.
    # Alpa's stage DP lays experts out over no expert-parallel group of their own (its
    # stages share one fixed expert degree), so a mixture of experts is searched in the
    # Megatron space, which folds expert degrees apart from attention's.
    if space == "megatron" or fixed.get("engine") == "torchtitan" or model.is_moe:
        from planner.search.megatron_space import search_megatron

        return search_megatron(model, cluster, gbs, fixed, flash_attention, progress,
                               collectives, both_cores=True)
    from planner.search.alpa_space import search_auto

    return search_auto(model, cluster, gbs, fixed, flash_attention, progress, collectives)
