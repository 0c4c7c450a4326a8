"""The plan `plan MODEL --cluster C --gpus N --global-batch-size B` returns: a full parallel
configuration, its pipeline stages, what it is predicted to do and how to launch it.

It round-trips through JSON (`to_json`/`from_json`) and is validated on load, like the
per-operator `Plan` of `planner/plan.py`, which it complements: that one says how each
operator of one mesh is sharded, this one how a whole cluster trains a model.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cost_models.step_time import StageLayout, StepPrediction
from planner.parallel import ParallelConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParallelDegrees(_Model):
    data: int = Field(ge=1, description="Data-parallel degree.")
    tensor: int = Field(ge=1, description="Tensor-parallel degree.")
    pipeline: int = Field(ge=1, description="Pipeline-parallel degree.")
    context: int = Field(ge=1, description="Context-parallel degree.")
    expert: int = Field(ge=1, description="Expert-parallel degree.")
    sequence_parallel: bool = Field(description="Sequence parallelism over the tensor group.")
    zero_stage: int = Field(ge=0, le=3, description="ZeRO stage; 1 = distributed optimizer.")
    virtual_pipeline: int = Field(ge=1, description="Model chunks per pipeline rank.")


class Stage(_Model):
    layers: tuple[int, int] = Field(description="Transformer layers [first, last) of the stage.")
    num_devices: int = Field(ge=1, description="GPUs the stage runs on.")
    mesh_shape: list[int] = Field(description="Logical mesh of the stage: [data, tensor].")


class Breakdown(_Model):
    compute_s: float = Field(description="Kernel time of the slowest stage.")
    tensor_parallel_comm_s: float = Field(description="Tensor/context-parallel collectives.")
    pipeline_comm_s: float = Field(description="Stage-to-stage transfers.")
    data_parallel_comm_s: float = Field(description="Exposed gradient reduction.")
    bubble_s: float = Field(description="Pipeline fill and drain.")
    optimizer_s: float = Field(description="Optimizer update.")


class Predicted(_Model):
    step_time_s: float = Field(description="Predicted time of one optimizer step.")
    tokens_per_s: float = Field(description="Tokens per second over the cluster.")
    model_tflops_per_gpu: float = Field(description="Model TFLOP/s per GPU.")
    hardware_tflops_per_gpu: float = Field(
        description="Executed TFLOP/s per GPU, recomputation included."
    )
    mfu: float = Field(
        description="Model FLOPs utilization of the dense peak at the matmul precision."
    )
    memory_gib_per_gpu: float = Field(description="Peak memory of the fullest GPU, GiB.")
    fits: bool = Field(description="Whether that peak fits in device memory.")
    breakdown: Breakdown = Field(description="Where the step time goes.")

    @classmethod
    def of(cls, prediction: StepPrediction) -> Predicted:
        values = prediction.to_dict()
        breakdown = Breakdown(**{k: values.pop(k) for k in Breakdown.model_fields})
        return cls(**values, breakdown=breakdown)


class TrainingPlan(_Model):
    version: int = Field(default=1, description="Schema version.")
    model: str = Field(description="The model as named on the command line.")
    cluster: str = Field(description="Cluster preset or file.")
    num_gpus: int = Field(ge=1, description="GPUs trained on.")
    global_batch_size: int = Field(ge=1, description="Sequences per optimizer step.")
    parallel: ParallelDegrees = Field(description="Parallel degrees.")
    micro_batch_size: int = Field(ge=1, description="Sequences per micro-batch.")
    num_micro_batches: int = Field(ge=1, description="Micro-batches per step per pipeline.")
    recompute: str = Field(description="Activation recomputation: none, selective, full.")
    schedule: str = Field(description="Pipeline schedule: gpipe, 1f1b, interleaved.")
    stages: list[Stage] = Field(description="Pipeline stages in order.")
    predicted: Predicted = Field(description="What the cost model predicts.")
    megatron_flags: list[str] | None = Field(
        default=None, description="Megatron-LM launch flags; None if Megatron cannot run it."
    )
    megatron_incompatibility: str | None = Field(
        default=None, description="Why Megatron-LM cannot run the plan, if it cannot."
    )

    @classmethod
    def build(
        cls,
        model: str,
        cluster: str,
        parallel: ParallelConfig,
        layouts: list[StageLayout],
        prediction: StepPrediction,
        megatron_flags: list[str] | None,
        incompatibility: str | None,
    ) -> TrainingPlan:
        stages, first = [], 0
        for layout in layouts:
            stages.append(Stage(
                layers=(first, first + layout.layers),
                num_devices=layout.devices * parallel.context,
                mesh_shape=[layout.data, layout.tensor],
            ))
            first += layout.layers
        return cls(
            model=model,
            cluster=cluster,
            num_gpus=sum(stage.num_devices for stage in stages),
            global_batch_size=parallel.global_batch_size,
            parallel=ParallelDegrees(
                data=parallel.data, tensor=parallel.tensor, pipeline=parallel.pipeline,
                context=parallel.context, expert=parallel.expert,
                sequence_parallel=parallel.sequence_parallel, zero_stage=parallel.zero_stage,
                virtual_pipeline=parallel.virtual_pipeline,
            ),
            micro_batch_size=parallel.micro_batch_size,
            num_micro_batches=parallel.num_micro_batches,
            recompute=parallel.recompute,
            schedule=parallel.schedule,
            stages=stages,
            predicted=Predicted.of(prediction),
            megatron_flags=megatron_flags,
            megatron_incompatibility=incompatibility,
        )

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> TrainingPlan:
        return cls.model_validate_json(Path(path).read_text())
