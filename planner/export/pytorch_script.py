"""PyTorch: `pytorch_train.py`, a short script that applies a Plan with torch's own pieces.

The script builds a `DeviceMesh` with the plan's axes, keeps on each pipeline rank the
model chunks the plan gives it (chunk c on rank c % pipeline), splits every block over the
`tp` axis with `parallelize_module` (the layout read off the plan's parameter placements:
`S(0)` on the tensor axis is column-parallel, `S(1)` row-parallel), recomputes as planned,
shards over the data axis with FSDP2 `fully_shard` (ZeRO-3 reshards parameters after
forward; ZeRO-0/1/2 keep them until backward), and runs the plan's schedule with
`torch.distributed.pipelining` (GPipe, 1F1B, interleaved 1F1B) or gradient accumulation.

The model is the user's: `build_chunk` returns layers [start, stop) of it, on the meta
device. By default it is Tessel's build of the planned shape (`runtime.stages`, whose
attention runs on a tensor-parallel shard of its heads), so the script runs as written
where Tessel is installed. Refused in one line: expert parallelism (torch's
`parallelize_module` has no expert-parallel style), context parallelism (torch's is an
experimental context manager around SDPA calls), an output layer tied to the embedding
across pipeline stages (pipelining does not keep the two copies equal), fp16 (needs loss
scaling) and fp8 (needs torchao).

Offload is FSDP2's: with the optimizer and the parameters both offloaded to the CPU (ZeRO-3)
`fully_shard` gets `offload_policy=CPUOffloadPolicy()`, which keeps the sharded parameters
and their gradients on the host and runs the optimizer step there; the process group then
has a gloo backend for CPU tensors beside NCCL, as TorchTitan's `enable_cpu_offload` sets
it up. One offload without the other, a fraction of the optimizer, NVMe (DeepSpeed's) and
activations (Megatron-LM's) are refused in one line.

LoRA is the script's own, a few lines and no peft (so the file runs where torch does): every
weight frozen; each targeted linear gains factors `lora_a` (rank x in, kaiming-uniform) and
`lora_b` (out x rank, zeros) and a forward hook adding (alpha / rank) B A x, placed before
tensor parallelism's output hook. The factors are added after `parallelize_module` (torch's
ColwiseParallel would split every parameter under the linear by rows) and before
`fully_shard`, split over the tensor ranks as the Plan lists them (`cost_models.adapters`):
beside a column-parallel linear A whole and B by rows, beside a row-parallel one A by
columns and B whole. QLoRA is refused: its 4-bit NF4 base needs torchao or bitsandbytes.

The tests import the script and build rank 0's mesh, chunks and schedule with torch itself
on a fake process group of the plan's size.
"""

from __future__ import annotations

import re
import textwrap
from string import Template

from planner.export.fsdp_offload import fsdp2_offload_refusal
from planner.vocabulary.placement_text import placement_pieces
from planner.models.config import TransformerConfig
from planner.vocabulary.plan import Plan, RunSettings

FILE = "pytorch_train.py"
TORCH_SCHEDULE_CLASSES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe",
             "interleaved": "ScheduleInterleaved1F1B"}
DEFAULT_STEPS = 1000


def pytorch_incompatibility(plan: Plan, model: TransformerConfig | None) -> str | None:
    """Why the PyTorch script cannot run `plan` (one line), or None."""
    q = plan.parallel
    if q is None or plan.micro_batch_size is None or plan.global_batch_size is None:
        return "it is an operator-level plan (run it with `plan check` or `planner.parallelize`)"
    if model is None:
        return "the plan's model shape is unknown (plan a preset or give its shape flags)"
    if plan.mesh_axes == ["device"]:
        return "its pipeline stages run on different meshes"
    if q.expert > 1:
        return "torch's parallelize_module has no expert-parallel style: use --emit megatron"
    if q.context > 1:
        return ("torch's context parallelism is an experimental context manager around "
                "SDPA: use --emit megatron or torchtitan")
    if model.tie_embeddings and q.pipeline > 1:
        return ("the output layer is tied to the embedding across pipeline stages, which "
                "torch.distributed.pipelining does not keep equal: use --emit megatron")
    if plan.precision in ("fp16", "fp8"):
        return f"{plan.precision} training needs more than torch (loss scaling or torchao)"
    if plan.schedule not in (None, *TORCH_SCHEDULE_CLASSES):
        looped = ", ".join(TORCH_SCHEDULE_CLASSES)
        return (f"the script lays chunks out in loop order for {looped}; "
                f"{plan.schedule} runs them in V order: use --emit torchtitan")
    if plan.run is not None and (plan.run.optimizer != "adam"
                                 or plan.run.optimizer_in_backward):
        return ("the script steps torch's AdamW after the backward, not bitsandbytes' 8-bit "
                "optimizers or a step in backward: plan without --optimizer and "
                "--optimizer-in-backward")
    if plan.run is not None and plan.run.loss_chunks > 1:
        return ("the script scores the whole output at once, not torchtune's chunked loss "
                "(--loss-chunks): plan without it")
    return _offload_or_adapters(plan.run)


def _offload_or_adapters(run: RunSettings | None) -> str | None:
    """Why the script cannot run the plan's offload or adapters (one line), or None: its
    offload is FSDP2's CPUOffloadPolicy (`planner.export.fsdp_offload`), its adapters
    LoRA's over a 16-bit base."""
    why = fsdp2_offload_refusal(run)
    if run is None or why is not None:
        return why
    if run.finetune == "qlora":
        return ("QLoRA's 4-bit NF4 base needs torchao or bitsandbytes beyond torch's own "
                "pieces: plan with --finetune lora")
    return None


def tensor_parallel_layout(plan: Plan) -> dict[str, str]:
    """Each block module's tensor-parallel style, 'colwise' or 'rowwise', read off the
    placements of the first layer's weights on the `tp` axis (empty without it)."""
    stage = plan.stages[0]
    if "tp" not in stage.mesh_axes or stage.mesh_shape[stage.mesh_axes.index("tp")] == 1:
        return {}
    axis = stage.mesh_axes.index("tp")
    first = (stage.chunks[0] if stage.chunks else stage.layers)[0]
    prefix = f"layers.{first}."
    layout = {}
    for name, text in stage.parameters.items():
        if not (name.startswith(prefix) and name.endswith(".weight")):
            continue
        kind, argument = placement_pieces(text)[axis]
        module = name[len(prefix):-len(".weight")]
        if kind == "S" and module.rsplit(".", 1)[-1] not in ("lora_a", "lora_b"):
            layout[module] = {"0": "colwise", "1": "rowwise"}[argument]
    return layout


def lora_linears(plan: Plan) -> tuple[str, ...]:
    """The names of the linears the plan's LoRA adapts (the zoo transformer's, for each of
    its targets: `cost_models.adapters.TARGET_LINEARS`); empty without LoRA."""
    from cost_models.adapters import TARGET_LINEARS

    run = plan.run
    if run is None or run.finetune != "lora":
        return ()
    return tuple(name for target in run.lora_targets for name in TARGET_LINEARS[target])


def pytorch_files(plan: Plan, model: TransformerConfig | None) -> dict[str, str]:
    """{'pytorch_train.py': ...}; ValueError (one line) when the script cannot run it."""
    why = pytorch_incompatibility(plan, model)
    if why:
        raise ValueError(f"the PyTorch script cannot run this plan: {why}")
    assert model is not None and plan.parallel is not None
    q = plan.parallel
    chunks = sorted(c for stage in plan.stages for c in (stage.chunks or [stage.layers]))
    what = re.sub(r"[^A-Za-z0-9_.:/() -]+", "-",
                  f"{plan.model} on {plan.num_gpus} GPUs ({plan.cluster})")
    zero = {3: "ZeRO-3", 2: "ZeRO-2"}.get(q.zero_stage, f"the plan's ZeRO-{q.zero_stage} as "
                                                         "ZeRO-2: less memory, same traffic")
    runs = (f"torch.distributed.pipelining ({TORCH_SCHEDULE_CLASSES[plan.schedule or '1f1b']})"
            if q.pipeline > 1 else
            f"gradient accumulation over {plan.num_micro_batches} micro-batches")
    run = plan.run
    offload = run is not None and run.offload_optimizer == run.offload_params == "cpu"
    linears = lora_linears(plan)
    lora = run is not None and bool(linears)
    values = {
        "WHAT": what,
        "ZERO_WORDS": zero,
        "RUNS": runs,
        "MESH_SHAPE": repr((q.pipeline, q.data, q.tensor)),
        "CHUNKS": _wrapped(repr(chunks)),
        "SHAPE": _literal(model.model_dump()),
        "TP_LAYOUT": _literal(tensor_parallel_layout(plan)),
        "SEQUENCE_PARALLEL": repr(q.sequence_parallel and q.tensor > 1),
        "RESHARD": repr(q.zero_stage == 3),
        "RECOMPUTE": repr(plan.recompute),
        "DTYPE": "torch.float32" if plan.precision == "fp32" else "torch.bfloat16",
        "REDUCE_DTYPE": "torch.bfloat16" if plan.run is not None
        and plan.run.main_grads_dtype == "bf16" else "torch.float32",
        "MICRO": str(plan.micro_batch_size),
        "MICRO_BATCHES": str(plan.num_micro_batches),
        "GLOBAL": str(plan.global_batch_size),
        "SCHEDULE": TORCH_SCHEDULE_CLASSES[plan.schedule or "1f1b"],
        "STEPS": str(plan.training.steps if plan.training else DEFAULT_STEPS),
        "OFFLOAD": repr(offload),
        "OFFLOAD_WORDS": ("\n- CPUOffloadPolicy: parameters, gradients and the optimizer "
                          "step on the host;" if offload else ""),
        "LORA_WORDS": "" if not lora else "\n" + "\n  ".join(textwrap.wrap(
            f"- LoRA, the script's own (no peft): rank {run.lora_rank}, alpha "
            f"{run.lora_alpha:g}, adapters beside {', '.join(run.lora_targets)}; every "
            "other weight frozen;", 88, break_on_hyphens=False)),
        "LORA_CONSTANTS": "" if not lora else Template(_LORA_CONSTANTS).substitute(
            LINEARS=_wrapped(repr(linears), 72), RANK=str(run.lora_rank),
            ALPHA=repr(float(run.lora_alpha))),
        "LORA_FUNCTIONS": _LORA_FUNCTIONS if lora else "",
        "DISTRIBUTE": ", distribute_tensor" if lora else "",
        "LORA_APPLY": _LORA_APPLY if lora else "",
        "LORA_INIT": _LORA_INIT if lora else "",
    }
    return {FILE: Template(_SCRIPT).substitute(values)}


def _wrapped(text: str, width: int = 88) -> str:
    """A long list literal broken after commas, continuation lines indented."""
    return "\n    ".join(textwrap.wrap(text, width, break_long_words=False,
                                      break_on_hyphens=False))


def _literal(mapping: dict) -> str:
    """A dict as Python source, one entry a line."""
    if not mapping:
        return "{}"
    return "{\n" + "".join(f"    {key!r}: {value!r},\n" for key, value in mapping.items()) + "}"


_SCRIPT = '''"""$WHAT, as Tessel planned it, with torch's own pieces:
- DeviceMesh: pp x dp x tp;
- parallelize_module: tensor parallelism;
- fully_shard: FSDP2, $ZERO_WORDS;$OFFLOAD_WORDS$LORA_WORDS
- $RUNS.

    torchrun --nproc-per-node GPUS_PER_HOST --nnodes HOSTS ... pytorch_train.py

build_chunk() and batches() are yours to replace: by default they build Tessel's model of
the planned shape (runtime.stages, whose attention runs on a tensor-parallel shard of its
heads) and random tokens.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.pipelining import PipelineStage, $SCHEDULE
from torch.distributed.tensor import DTensor, Replicate, Shard$DISTRIBUTE
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

MESH_AXES, MESH_SHAPE = ("pp", "dp", "tp"), $MESH_SHAPE
# Layers [start, stop) of each model chunk, in model order; chunk c runs on pipeline rank
# c % pp (more than pp chunks: the interleaved schedule's virtual stages).
CHUNKS = $CHUNKS
SHAPE = $SHAPE
# Each block module's tensor-parallel style, read off the plan's parameter placements.
TP_LAYOUT = $TP_LAYOUT
SEQUENCE_PARALLEL = $SEQUENCE_PARALLEL
# ZeRO-3 gathers parameters again in backward; otherwise FSDP2 keeps them from forward to
# backward, with gradients and optimizer state sharded (ZeRO-2).
RESHARD_AFTER_FORWARD = $RESHARD
# FSDP2's CPU offload: sharded parameters and gradients kept on the host, the optimizer
# step run there, each block's shards copied to the GPU for its all-gather.
CPU_OFFLOAD = $OFFLOAD
${LORA_CONSTANTS}RECOMPUTE = $RECOMPUTE
PARAM_DTYPE = $DTYPE
REDUCE_DTYPE = $REDUCE_DTYPE  # FSDP2's gradient reduce-scatters, as the plan prices them
MICRO_BATCH_SIZE, MICRO_BATCHES, GLOBAL_BATCH_SIZE = $MICRO, $MICRO_BATCHES, $GLOBAL
STEPS, LOG_EVERY = $STEPS, 10


def build_chunk(start: int, stop: int, first: bool, last: bool) -> nn.Module:
    """Layers [start, stop) of your model on the meta device, with the embedding if first
    and the final norm and output layer if last; its blocks in `.layers` by layer index."""
    from planner.models.config import TransformerConfig
    from runtime.stages import build_stage

    return build_stage(TransformerConfig(**SHAPE), (start, stop), first, last)


def init_weights(chunk: nn.Module, device: torch.device) -> None:
    """Materialize the chunk's (sharded) parameters on `device` with their initial values."""
    from runtime.stages import materialize

    materialize(chunk, seed=0, device=device)


def batches(device: torch.device, vocab_size: int, seq_length: int):
    """This data-parallel rank's sequences of each step: MICRO_BATCHES x MICRO_BATCH_SIZE."""
    while True:
        tokens = torch.randint(0, vocab_size, (MICRO_BATCHES * MICRO_BATCH_SIZE,
                                               seq_length + 1), device=device)
        yield tokens[:, :-1], tokens[:, 1:]


def tensor_parallel(chunk: nn.Module, tp: DeviceMesh) -> None:
    """Megatron's layout: column-parallel in, row-parallel out, vocabulary-parallel
    embedding and head; norms on sequence shards with SEQUENCE_PARALLEL."""
    seq = Shard(1) if SEQUENCE_PARALLEL else Replicate()
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in chunk.layers.values():
        block.attn.local_heads(tp.size())
        plan = {name: styles[style]() for name, style in TP_LAYOUT.items()}
        for name, style in TP_LAYOUT.items():
            if style == "rowwise" and ".experts." not in name:
                plan[name] = RowwiseParallel(output_layouts=seq)
        plan["attn"] = PrepareModuleInput(input_layouts=(seq, None),
                                          desired_input_layouts=(Replicate(), None))
        plan["mlp"] = PrepareModuleInput(input_layouts=(seq,),
                                         desired_input_layouts=(Replicate(),))
        if SEQUENCE_PARALLEL and any(".experts." in name for name in TP_LAYOUT):
            # Experts' outputs are all-reduced (replicated) before their routing weights
            # scale them; the weighted sum is cut back to this rank's sequence shard.
            plan["mlp"] = PrepareModuleInputOutput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                use_local_input=True, output_layouts=(Replicate(),),
                desired_output_layouts=(seq,), use_local_output=True)
        if SEQUENCE_PARALLEL:
            plan |= {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel()}
        parallelize_module(block, tp, plan)
    if chunk.embed is not None:
        parallelize_module(chunk, tp, {"embed": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate())})
        if SEQUENCE_PARALLEL and chunk.first_stage:
            chunk.scatter_sequence = lambda x: DTensor.from_local(
                x, tp, [Replicate()]).redistribute(tp, [Shard(1)]).to_local()
    if chunk.last_stage:
        head = {"final_norm": SequenceParallel()} if SEQUENCE_PARALLEL else {}
        if chunk.lm_head is not None:
            head["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
        else:  # tied: the head is the vocabulary-parallel embedding
            chunk.head_input_layout = seq
        parallelize_module(chunk, tp, head)


${LORA_FUNCTIONS}
def parallelize(chunk: nn.Module, mesh: DeviceMesh) -> nn.Module:
    if mesh["tp"].size() > 1:
        tensor_parallel(chunk, mesh["tp"])
${LORA_APPLY}    for name, block in list(chunk.layers.items()):
        if RECOMPUTE == "full":
            chunk.layers[name] = checkpoint_wrapper(block)
        elif RECOMPUTE == "selective":
            block.attn.recompute_core = True  # recompute softmax(QK^T)V only
    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE)
    # Pinned host memory needs a GPU; a CPU smoke test offloads unpinned.
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if CPU_OFFLOAD \\
        else OffloadPolicy()
    for block in chunk.layers.values():
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy, offload_policy=offload,
                    reshard_after_forward=RESHARD_AFTER_FORWARD)
    return fully_shard(chunk, mesh=mesh["dp"], mp_policy=policy, offload_policy=offload,
                       reshard_after_forward=RESHARD_AFTER_FORWARD)


def build(device_type: str) -> tuple[DeviceMesh, list[int], list[nn.Module], object]:
    """The mesh, this rank's chunk indices and chunks (parallelized, on the meta device),
    and the pipeline schedule (None without a pipeline)."""
    mesh = init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_AXES)
    pp = mesh["pp"].size()
    mine = [c for c in range(len(CHUNKS)) if c % pp == mesh["pp"].get_local_rank()]
    chunks = [parallelize(build_chunk(*CHUNKS[c], c == 0, c == len(CHUNKS) - 1), mesh)
              for c in mine]
    if pp == 1:
        return mesh, mine, chunks, None
    device = torch.device(device_type, torch.accelerator.current_device_index()) \\
        if device_type != "cpu" else torch.device("cpu")
    stages = [PipelineStage(chunk, c, len(CHUNKS), device, group=mesh["pp"].get_group())
              for c, chunk in zip(mine, chunks)]
    stage = stages if len(stages) > 1 else stages[0]
    schedule = $SCHEDULE(stage, n_microbatches=MICRO_BATCHES, loss_fn=loss)
    return mesh, mine, chunks, schedule


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def clip_gradients(params: list[nn.Parameter], mesh: DeviceMesh, max_norm: float,
                   device: torch.device) -> None:
    """Clip by the norm of the whole model's gradients: summed per device mesh (DTensor
    reduces each over its own mesh), then over the pipeline ranks; reduced on `device`,
    the compute device (CPU-offloaded gradients are on the host)."""
    by_mesh: dict = {}
    for param in params:
        if param.grad is not None:
            key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(param.grad)
    squares = torch.zeros((), device=device)
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):
            norm = DTensor.from_local(norm.to_local().to(device), norm.device_mesh,
                                      norm.placements).full_tensor()
        squares = squares + norm.to(device) ** 2
    if mesh["pp"].size() > 1:
        dist.all_reduce(squares, group=mesh["pp"].get_group())
    scale = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
    for grads in by_mesh.values():  # one mesh at a time: DTensor ops stay on one mesh
        for grad in grads:
            grad.mul_(scale.to(grad.device))


def main() -> None:
    cuda = torch.cuda.is_available()  # else CPU processes on gloo: a smoke test
    if not dist.is_initialized():  # CPU offload: gloo for the host's tensors beside NCCL
        dist.init_process_group(("cuda:nccl,cpu:gloo" if CPU_OFFLOAD else "nccl") if cuda
                                else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mesh, mine, chunks, schedule = build(device.type)
    for chunk in chunks:  # FSDP2 keeps offloaded shards on the host: made there
        init_weights(chunk, torch.device("cpu") if CPU_OFFLOAD else device)
${LORA_INIT}    params = [p for chunk in chunks for p in chunk.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)
    data = batches(device, SHAPE["vocab_size"], SHAPE["seq_length"])
    first, last = 0 in mine, len(CHUNKS) - 1 in mine
    reports = mesh["dp"].get_local_rank() == 0 and mesh["tp"].get_local_rank() == 0
    for step in range(STEPS):
        tokens, labels = next(data)
        if schedule is None:  # one stage: accumulate gradients over the micro-batches
            step_loss = 0.0
            for micro in range(MICRO_BATCHES):
                rows = slice(micro * MICRO_BATCH_SIZE, (micro + 1) * MICRO_BATCH_SIZE)
                micro_loss = loss(chunks[0](tokens[rows]), labels[rows]) / MICRO_BATCHES
                micro_loss.backward()
                step_loss = step_loss + micro_loss.detach()
        else:
            losses = []
            inputs = (tokens,) if first else ()
            schedule.step(*inputs, target=labels if last else None, losses=losses)
            step_loss = torch.stack(losses).mean() if losses else None
        clip_gradients(params, mesh, max_norm=1.0, device=device)
        optimizer.step()
        optimizer.zero_grad()
        if step_loss is not None and step % LOG_EVERY == 0 and reports:
            print(f"step {step}: loss {step_loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

_LORA_CONSTANTS = '''# LoRA: the linears adapted (by module name), the adapters' rank and alpha.
LORA_LINEARS = $LINEARS
LORA_RANK, LORA_ALPHA = $RANK, $ALPHA
'''

_LORA_FUNCTIONS = '''def add_lora(chunk: nn.Module, tp: DeviceMesh) -> None:
    \"\"\"LoRA (Hu et al. 2021), this script's own: every weight frozen; each linear of
    LORA_LINEARS gains factors lora_a (rank x in) and lora_b (out x rank) and returns
    W x + LORA_ALPHA / LORA_RANK * B A x. Run after tensor parallelism (ColwiseParallel
    would split every parameter under the linear by rows) and before fully_shard: beside a
    column-parallel W, A whole and B split by rows like W; beside a row-parallel W, A split
    by columns like W and B whole, so the adapter's output joins W's column shard, or its
    partial sum before W's all-reduce.\"\"\"
    for param in chunk.parameters():
        param.requires_grad_(False)
    splits = {"colwise": (Replicate(), Shard(0)), "rowwise": (Shard(1), Replicate())}
    for block in chunk.layers.values():
        for name, linear in list(block.named_modules()):
            if name.rsplit(".", 1)[-1] not in LORA_LINEARS or not isinstance(linear, nn.Linear):
                continue
            split = splits.get(TP_LAYOUT.get(name)) if tp.size() > 1 else None
            shapes = ((LORA_RANK, linear.in_features), (linear.out_features, LORA_RANK))
            for index, (factor, shape) in enumerate(zip(("lora_a", "lora_b"), shapes)):
                weight = torch.empty(shape, device=linear.weight.device)
                if split is not None:
                    weight = distribute_tensor(weight, tp, [split[index]], src_data_rank=None)
                module = nn.Linear(shape[1], shape[0], bias=False, device="meta")
                module.weight = nn.Parameter(weight)
                linear.register_module(factor, module)
            linear.register_forward_hook(lora_forward, prepend=True)


def lora_forward(linear: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    \"\"\"W x plus the adapter's (alpha / rank) B A x, on the input and output as tensor
    parallelism holds them inside the linear (this hook runs before its output hook).\"\"\"
    return output + LORA_ALPHA / LORA_RANK * linear.lora_b(linear.lora_a(args[0]))


def init_lora(chunk: nn.Module, seed: int = 0) -> None:
    \"\"\"LoRA's initial adapters, after init_weights (which may load a trained base): A
    kaiming-uniform (nn.Linear's own init), B zeros, so the first step's loss is the
    base's. Every rank draws the same full A (its generator keyed by the seed and the
    factor's name) and keeps its shard.\"\"\"
    import math
    import zlib

    with torch.no_grad():
        for name, param in chunk.named_parameters():
            if not name.endswith((".lora_a.weight", ".lora_b.weight")):
                continue
            full = torch.zeros(param.shape)
            if name.endswith(".lora_a.weight"):
                key = seed * 1_000_003 + zlib.crc32(name.encode())
                nn.init.kaiming_uniform_(full, a=math.sqrt(5),
                                         generator=torch.Generator().manual_seed(key))
            if isinstance(param, DTensor):
                full = distribute_tensor(full, param.device_mesh, param.placements,
                                         src_data_rank=None).to_local()
                param = param.to_local()
            param.copy_(full)


'''

_LORA_APPLY = '''    add_lora(chunk, mesh["tp"])  # beside the tensor-parallel linears, before FSDP2
'''

_LORA_INIT = '''        init_lora(chunk)
'''
