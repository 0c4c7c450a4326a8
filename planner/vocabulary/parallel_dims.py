"""Every parallel degree of a training plan in one value, in the manner of torchtitan's
`ParallelDims`: `-1` (data) resolved once against the GPU count, `*_enabled` properties,
one validation that names every degree, and the device mesh laid out from it.

The mesh's axes, slowest first, are pipeline, data, context and tensor (their mesh axis
names `pp`, `dp`, `cp`, `tp`): tensor parallelism fastest, so neighbouring ranks share the
group with the most traffic, as Megatron-LM lays ranks out. Experts are not an axis of it:
`expert` x `expert_tensor` ranks are folded over a pipeline stage's tensor x context x data
ranks (Megatron-Core's parallel folding, Liu et al. 2025, arXiv 2504.14960); the rest are
the expert-data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.vocabulary.mesh_axes import MESH_AXES


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one training plan."""

    pipeline: int = 1
    """Pipeline stages (mesh axis pp)."""
    data: int = 1
    """Data-parallel replicas (mesh axis dp); -1: the GPUs the others leave (`resolve`)."""
    context: int = 1
    """Context-parallel ranks splitting the sequence (mesh axis cp)."""
    tensor: int = 1
    """Tensor-parallel ranks (mesh axis tp)."""
    expert: int = 1
    """Expert-parallel ranks: each routed expert lives on one of them."""
    expert_tensor: int | None = None
    """Tensor-parallel ranks inside each expert; None: `tensor`, as Megatron-LM defaults."""

    @property
    def pp(self) -> int:
        """The pp axis's size."""
        return self.pipeline

    @property
    def dp(self) -> int:
        """The dp axis's size."""
        return self.data

    @property
    def cp(self) -> int:
        """The cp axis's size."""
        return self.context

    @property
    def tp(self) -> int:
        """The tp axis's size."""
        return self.tensor

    @property
    def pp_enabled(self) -> bool:
        return self.pipeline > 1

    @property
    def dp_enabled(self) -> bool:
        return self.data > 1

    @property
    def cp_enabled(self) -> bool:
        return self.context > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tensor > 1

    @property
    def ep_enabled(self) -> bool:
        return self.expert > 1

    @property
    def expert_tensor_degree(self) -> int:
        """Tensor-parallel ranks inside each expert: `expert_tensor`, else `tensor`."""
        return self.expert_tensor if self.expert_tensor is not None else self.tensor

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans: tensor x pipeline x context."""
        return self.tensor * self.pipeline * self.context

    @property
    def expert_data(self) -> int:
        """Expert-data-parallel ranks: a stage's tensor x context x data ranks over those
        one set of experts spans (expert x expert_tensor). Resolved dims only."""
        return self.tensor * self.context * self.data // (
            self.expert * self.expert_tensor_degree)

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh's shape, its axes `MESH_AXES`."""
        return (self.pipeline, self.data, self.context, self.tensor)

    @property
    def world_size(self) -> int:
        return self.pipeline * self.data * self.context * self.tensor

    def resolve(self, num_gpus: int) -> ParallelDims:
        """These degrees with `data = -1` filled in for `num_gpus`; ValueError, in one
        message naming every degree, where one is not positive, they do not multiply to
        the GPUs, or the experts do not fold over a stage's ranks."""
        problems = [f"{name} must be positive, got {value}" for name, value in (
            ("tensor", self.tensor), ("pipeline", self.pipeline), ("context", self.context),
            ("expert", self.expert), ("expert_tensor", self.expert_tensor or 1))
            if value < 1]
        if self.data < 1 and self.data != -1:
            problems.append(f"data must be positive or -1 (the rest), got {self.data}")
        if problems:
            raise ValueError("; ".join(problems) + ".")
        data = self.data if self.data != -1 else num_gpus // self.model_parallel
        degrees = (
            f"tensor ({self.tensor}) x pipeline ({self.pipeline}) x context "
            f"({self.context}) x data ({self.data if self.data != -1 else 'rest'})"
        )
        if data < 1 or self.model_parallel * data != num_gpus:
            raise ValueError(f"{degrees} must multiply to the {num_gpus} GPUs; change a degree.")
        stage_ranks = self.tensor * self.context * data
        if stage_ranks % (self.expert * self.expert_tensor_degree):
            raise ValueError(
                f"expert ({self.expert}) x expert_tensor ({self.expert_tensor_degree}) "
                f"must divide the {stage_ranks} ranks of a pipeline stage (tensor x context "
                f"x data) on {num_gpus} GPUs with {degrees}; choose degrees that divide "
                f"{stage_ranks}."
            )
        return replace(self, data=data)

    def coordinates(self, rank: int) -> dict[str, int]:
        """The rank's index on each mesh axis (tensor fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        coords = {}
        for axis, size in reversed(list(zip(MESH_AXES, self.shape))):
            coords[axis] = rank % size
            rank //= size
        return {axis: coords[axis] for axis in MESH_AXES}

    def group(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of `rank` but `axis`, in axis order."""
        coords = self.coordinates(rank)
        sizes = dict(zip(MESH_AXES, self.shape))
        ranks = []
        for index in range(sizes[axis]):
            moved = dict(coords, **{axis: index})
            flat = 0
            for name in MESH_AXES:
                flat = flat * sizes[name] + moved[name]
            ranks.append(flat)
        return ranks
