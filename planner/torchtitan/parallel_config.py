"""The parallel configuration a TorchTitan 0.2 job config runs, as Tessel's `ParallelConfig`.

TorchTitan's defaults apply to absent keys and its rules are checked, each named by the
code that sets it (torchtitan 0.2.2):

- degrees (`ParallelDims._validate`): replicate x shard x context x tensor x pipeline is the
  world size; a shard degree of -1 takes the GPUs the others leave.
- data parallelism (`parallelize_llama`, `apply_fsdp`): FSDP2 over shard x context whenever
  either is above 1 (ZeRO-3 here; `fsdp_reshard_after_forward` says when gathered weights
  are freed); DDP over the replicate degree only where it is the sole parallelism
  ("DDP has not supported > 1D parallelism"); both at once (HSDP) is refused.
- batches (`Trainer.__init__`, `build_pipeline_schedule`): global defaults to local x
  data-parallel and is a multiple of it (gradient accumulation); under pipelining each
  local batch is cut into micro-batches of `pipeline_parallel_microbatch_size`.
- the pipeline split (`pipeline_llm`, `generate_llm_fqn_per_model_part`): the model parts
  given, or TorchTitan's own, the embedding and the output counted as layers; parts on
  rank r are r, r + pipeline, ... (its "loop" style, Megatron-LM's interleaving).
- activation checkpointing (`apply_ac`): none, full, op-level selective ("op") or
  layer-level selective (every k-th block).
- tensor parallelism (`apply_tp`) always runs with sequence parallelism, and with loss
  parallelism unless disabled; async TP needs compile (`maybe_enable_async_tp`).
- float8 (`Float8LinearConverter`): tensorwise scaling, fp8 all-gathers only over a shard
  degree above 1 and without a recipe name.
- CPU offload (`training.enable_cpu_offload`, `apply_fsdp`): FSDP2's CPUOffloadPolicy,
  parameters, gradients and the optimizer step on the host together, under FSDP2 only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from planner.vocabulary.parallel_dims import ParallelDims
from planner.vocabulary.knobs import spelt
from planner.vocabulary.parallel import RESHARD_POLICIES, ParallelConfig
from planner.vocabulary.schedules import V_SHAPED, schedule_info
from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.keys import shown
from planner.torchtitan.rules import part_layers, rank_of_part

MOST = (1 << 31) - 1
"""The most any count of a job config takes (degrees, batch sizes, steps): int32's, which
every one of them fits many times over; 10**21 sequences a batch is no job to plan."""

if TYPE_CHECKING:
    from planner.models.config import TransformerConfig
    from planner.torchtitan.keys import Flattened

P = "parallelism."
# torch.distributed.pipelining's schedules by TorchTitan's (case-insensitive) names, and
# the ones Tessel prices, by its own names.
TORCH_SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
                   "PipelineScheduleSingle", "PipelineScheduleMulti", "ZBVZeroBubble",
                   "DualPipeV")
# The knobs TorchTitan's keys spell (the knob registry's: `planner.vocabulary.knobs`).
KEY = {name: spelling.key for name, spelling in spelt("torchtitan").items()}
_SCHEDULE = spelt("torchtitan")["schedule"]
SCHEDULE_OF_TORCHTITAN = {name.lower(): schedule for schedule, name in _SCHEDULE.table}
CONVERTERS = ("quantize.linear.float8", "quantize.linear.mx", "quantize.grouped_mm.float8",
              "quantize.grouped_mm.mx")
# Linear layers a float8 or MX converter may leave in bf16 that Tessel prices as given
# (the output layer: see `_filtered`).
FILTERS = ([], ["output"])


class _Degrees(NamedTuple):
    """What TorchTitan's parallelism section says beyond the degrees themselves."""

    dims: ParallelDims
    """The degrees (data: replicate x shard)."""
    shard: int
    """data_parallel_shard_degree, -1 resolved."""
    zero_stage: int


class _Values:
    """The flattened job config's values, read with TorchTitan's types; errors name the
    file and the key."""

    def __init__(self, keys: Flattened, source: str) -> None:
        self.values, self.given, self.source = keys.values, keys.given, source

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def error(self, text: str) -> JobConfigError:
        return JobConfigError(f"{self.source}: {text}")

    def whole(self, key: str, least: int = 1, also: tuple[int, ...] = ()) -> int:
        """The whole number at `key`, from `least` to `MOST` (or one of `also`)."""
        value = self.values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value > MOST or (
                value < least and value not in also):
            allowed = " or ".join([f"a whole number from {least} to {MOST:,}",
                                   *map(str, also)])
            raise self.error(f"{key} = {shown(value)} must be {allowed}")
        return value

    def text(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        value = self.values[key]
        if not isinstance(value, str) or (choices is not None and value not in choices):
            wanted = "one of " + ", ".join(f'"{c}"' for c in choices) if choices else "text"
            raise self.error(f"{key} = {shown(value)} must be {wanted}")
        return value

    def flag(self, key: str) -> bool:
        value = self.values[key]
        if not isinstance(value, bool):
            raise self.error(f"{key} = {shown(value)} must be true or false")
        return value

    def names(self, key: str) -> list[str]:
        value = self.values[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            # TorchTitan splits commas only on its command line; from the file a string
            # would be iterated letter by letter.
            raise self.error(f'{key} = {shown(value)} must be a list of names, e.g. '
                             f'{key.rsplit(".", 1)[-1]} = ["..."]')
        return value


def parallel_config(
    keys: Flattened, model: TransformerConfig, gpus: int | None, source: str,
    notes: list[str],
) -> tuple[ParallelConfig, list[int] | None, list[int] | None]:
    """The configuration TorchTitan runs for the job config `keys` of `model` (the file
    named `source`), resolved for its world size; the blocks of each pipeline stage and of
    each model part (in model order, interleaved schedules), each where they differ (None:
    an even split). `gpus` is the GPU count given (None: the degrees must give it).
    JobConfigError, naming the key, for what TorchTitan refuses or Tessel cannot price;
    defaults worth knowing are added to `notes`."""
    v = _Values(keys, source)
    d = _degrees(v, model, gpus, notes)
    tp, cp, pp, zero = d.dims.tensor, d.dims.context, d.dims.pipeline, d.zero_stage
    micro, batch, micro_batches = _batches(v, d.dims.data, pp, notes)
    schedule, virtual, layers, chunks = _pipeline(v, model.num_layers, pp, micro_batches,
                                                  notes)
    recompute, every = _recompute(v, notes)
    precision, recipe, fp8_gather = _precision(v, d.shard, notes)
    compiled, compiled_loss = _compile(v)
    policy = v.text(KEY["fsdp_reshard_after_forward"], RESHARD_POLICIES)
    async_tp = v.flag(KEY["tp_comm_overlap"]) and tp > 1
    if async_tp and not compiled:
        raise v.error(f"{P}enable_async_tensor_parallel = true needs compile.enable = true "
                      'with "model" in compile.components (TorchTitan raises otherwise); '
                      "add them or turn async tensor parallelism off")
    if tp > 1 and v.flag(P + "disable_loss_parallel"):
        raise v.error(f"{P}disable_loss_parallel = true changes the output layer's memory "
                      "(the whole logits on every tensor-parallel rank), which Tessel cannot "
                      "price yet; remove it (loss parallelism is TorchTitan's default)")
    optimizer = v.text("optimizer.name")
    if optimizer not in ("Adam", "AdamW"):
        raise v.error(f'optimizer.name = "{optimizer}": TorchTitan 0.2 builds Adam and '
                      'AdamW only; use "AdamW"')
    if zero == 3 and pp > 1 and policy == "default":
        notes.append('fsdp_reshard_after_forward "default": under pipeline parallelism '
                     "TorchTitan keeps each block's gathered weights from forward to backward")
    experts = _experts(v, model, d.shard, cp, tp)
    offload = _offload(v, zero)
    config = ParallelConfig.of(
        **experts, tensor=tp, pipeline=pp, data=d.dims.data, context=cp,
        # TorchTitan's tensor parallelism always shards norms over the sequence.
        sequence_parallel=tp > 1, micro_batch_size=micro, global_batch_size=batch,
        recompute=recompute, recompute_every=every, zero_stage=zero, schedule=schedule,
        virtual_pipeline=virtual,
        # FSDP2 reduce-scatters each block's gradients during backward and prefetches the
        # next block's all-gather; DDP all-reduces buckets during backward.
        overlap_grad_reduce=True, overlap_param_gather=zero >= 1,
        tp_comm_overlap=async_tp, precision=precision, fp8_recipe=recipe,
        engine="torchtitan", fsdp_reshard_after_forward=policy, compile=compiled,
        compile_loss=compiled_loss, fp8_param_gather=fp8_gather,
        offload_optimizer=offload, offload_params=offload,
    )
    try:
        return config.resolve(d.dims.world_size), layers, chunks
    except ValueError as error:
        raise v.error(f"the configuration on {d.dims.world_size} GPUs: {error}") from None


def _degrees(
    v: _Values, model: TransformerConfig, gpus: int | None, notes: list[str]
) -> _Degrees:
    """The degrees, checked as TorchTitan checks them."""
    replicate = v.whole(P + "data_parallel_replicate_degree")
    shard = v.whole(P + "data_parallel_shard_degree", also=(-1,))
    cp, tp = v.whole(KEY["context"]), v.whole(KEY["tensor"])
    pp = v.whole(KEY["pipeline"])
    named = {"data_parallel_replicate_degree": replicate, "context_parallel_degree": cp,
             "tensor_parallel_degree": tp, "pipeline_parallel_degree": pp}
    others = replicate * cp * tp * pp
    if shard == -1:
        if gpus is None:
            raise v.error(f"{P}data_parallel_shard_degree is -1 (TorchTitan's default: the "
                          "GPUs the other degrees leave), so the file does not say how many "
                          "GPUs run it; add --gpus N")
        if gpus % others:
            raise v.error(f"--gpus {gpus} is not divisible by {_product(named)} = {others}, "
                          f"so {P}data_parallel_shard_degree -1 (the GPUs left over) is not "
                          "whole; change a degree or --gpus")
        shard = gpus // others
        notes.append(f"data_parallel_shard_degree -1: {shard}, the GPUs the other degrees "
                     "leave")
    world = others * shard
    if gpus is not None and gpus != world:
        named = {"data_parallel_shard_degree": shard, **named}
        raise v.error(f"{_product(named)} = {world} GPUs, but --gpus is {gpus}; make them "
                      "agree or drop --gpus")
    heads, groups = model.num_attention_heads, model.num_kv_heads
    if heads % tp or groups % tp:
        raise v.error(f"{P}tensor_parallel_degree {tp} must divide the model's {heads} "
                      f"attention heads and {groups} key/value heads; choose a divisor of "
                      f"{math.gcd(heads, groups)}")
    if model.seq_length % (2 * tp * cp):
        # parallelize_llama: seq_len % (tensor x 2 x context) == 0 (sequence parallelism
        # and context parallelism's load-balanced halves).
        raise v.error(f"training.seq_len {model.seq_length} must be a multiple of "
                      f"tensor_parallel_degree {tp} x 2 x context_parallel_degree {cp} = "
                      f"{2 * tp * cp} (TorchTitan's rule); change either")
    if cp > 1:
        _check_context(v)
    fsdp = shard * cp > 1  # ParallelDims.fsdp_enabled: FSDP2 over shard x context
    if replicate > 1 and fsdp:
        raise v.error(f"HSDP ({P}data_parallel_replicate_degree {replicate} x "
                      f"{'data_parallel_shard_degree ' + str(shard) if shard > 1 else ''}"
                      f"{' x ' if shard > 1 and cp > 1 else ''}"
                      f"{'context_parallel_degree ' + str(cp) if cp > 1 else ''}): parameters "
                      "sharded within groups and replicated across them, which Tessel cannot "
                      "price yet; use one data-parallel degree (data_parallel_shard_degree "
                      "for FSDP)")
    if replicate > 1 and (tp > 1 or pp > 1):
        raise v.error(f"{P}data_parallel_replicate_degree {replicate} with tensor or "
                      "pipeline parallelism: TorchTitan's DDP does not compose with them "
                      '("DDP has not supported > 1D parallelism"); use '
                      "data_parallel_shard_degree (FSDP) instead")
    dims = ParallelDims(pipeline=pp, data=replicate * shard, context=cp, tensor=tp)
    return _Degrees(dims, shard, 3 if fsdp else 0)


def _experts(v: _Values, model: TransformerConfig, shard: int, cp: int,
             tp: int) -> dict[str, Any]:
    """The expert knobs of a mixture of experts (none for a dense model, whose expert keys
    TorchTitan documents as having no effect). TorchTitan 0.3 (ParallelDims: `efsdp =
    dp_shard x cp x tp / ep`) spreads experts over the shard x context x tensor ranks, as
    Tessel folds them, each expert whole (no expert tensor parallelism), tokens sent by
    all-to-all (its "standard" dispatch); debug.moe_force_load_balance routes them evenly."""
    if not model.is_moe:
        return {}
    ep = v.whole(P + "expert_parallel_degree")
    folded = shard * cp * tp
    if folded % ep or (model.num_experts or 1) % ep:
        raise v.error(f"{P}expert_parallel_degree {ep} must divide both the model's "
                      f"{model.num_experts} experts and data_parallel_shard_degree x "
                      f"context x tensor = {folded} ranks (TorchTitan's rule); choose a "
                      "divisor of both")
    return {"expert": ep, "expert_tensor": 1, "moe_token_dispatcher": "alltoall",
            "moe_router_force_load_balancing": v.flag("debug.moe_force_load_balance")}


def _offload(v: _Values, zero: int) -> str:
    """Where training.enable_cpu_offload keeps the optimizer's state and the parameters:
    FSDP2's CPUOffloadPolicy (`apply_fsdp`) puts the sharded parameters, their gradients
    and the optimizer step on the host, all together ("cpu" for both), under FSDP2 only;
    "none" without it."""
    key = KEY["offload_optimizer"]
    if not v.flag(key):
        return "none"
    if zero != 3:
        raise v.error(f"{key} = true without FSDP2 (data_parallel_shard_degree x "
                      "context_parallel_degree is 1): TorchTitan applies CPUOffloadPolicy in "
                      "apply_fsdp only, yet builds the model on the CPU; shard the "
                      f"data-parallel ranks ({P}data_parallel_shard_degree) or remove it")
    return "cpu"


def _product(named: dict[str, int]) -> str:
    """'tensor_parallel_degree 8 x pipeline_parallel_degree 2' of the degrees above 1."""
    shown_ = [f"{name} {value}" for name, value in named.items() if value > 1]
    return " x ".join(shown_) or "the degrees (all 1)"


def _check_context(v: _Values) -> None:
    """Context parallelism as Tessel prices it: causal attention balanced over the ranks
    (the head-tail split) and the keys and values all-gathered."""
    balancer = v[P + "context_parallel_load_balancer"]
    if balancer != "headtail":
        raise v.error(f"{P}context_parallel_load_balancer = {shown(balancer)} changes how "
                      "attention work is spread over context ranks, which Tessel cannot "
                      'price yet; use "headtail" (the default)')
    rotate = v.text(P + "context_parallel_rotate_method", ("allgather", "alltoall"))
    if rotate != "allgather":
        raise v.error(f'{P}context_parallel_rotate_method = "{rotate}" changes the key/value '
                      "exchange, which Tessel cannot price yet; use \"allgather\" (the "
                      "default)")


def _batches(v: _Values, data: int, pp: int, notes: list[str]) -> tuple[int, int, int]:
    """(micro-batch, global batch, micro-batches per pipeline schedule)."""
    local = v.whole("training.local_batch_size")
    batch = v.whole("training.global_batch_size", also=(-1,))
    if "training.local_batch_size" not in v.given:
        notes.append(f"training.local_batch_size {local} (TorchTitan's default)")
    if batch == -1:
        batch = local * data
    if batch % (local * data):
        raise v.error(f"training.global_batch_size {batch} must be a multiple of "
                      f"local_batch_size {local} x the data-parallel degree {data} = "
                      f"{local * data} (TorchTitan's rule); change either")
    accumulation = batch // (local * data)
    if pp == 1:
        return local, batch, accumulation
    micro = v.whole(P + "pipeline_parallel_microbatch_size")
    if local % micro:
        raise v.error(f"training.local_batch_size {local} must be a multiple of "
                      f"{P}pipeline_parallel_microbatch_size {micro} (TorchTitan's rule); "
                      "change either")
    if accumulation > 1:
        raise v.error(f"training.global_batch_size {batch} is {accumulation} x local_batch_size "
                      f"{local} x data-parallel {data}: TorchTitan then runs the pipeline "
                      f"schedule {accumulation} times a step, and Tessel prices one schedule "
                      f"of all a step's micro-batches; set local_batch_size = {batch // data}")
    return micro, batch, local // micro


def _pipeline(
    v: _Values, num_layers: int, pp: int, micro_batches: int, notes: list[str]
) -> tuple[str, int, list[int] | None, list[int] | None]:
    """(schedule, model parts per rank, blocks of each stage and of each part in model
    order, each where they differ)."""
    if pp == 1:
        return "1f1b", 1, None, None  # TorchTitan builds no schedule without pipelining
    key = KEY["schedule"]
    name = v.text(key)
    known = {s.lower(): s for s in TORCH_SCHEDULES}
    if name.lower() not in known:
        raise v.error(f'{key} = "{name}" is not a schedule of torch.distributed.pipelining '
                      f"({', '.join(TORCH_SCHEDULES)})")
    if name.lower() not in SCHEDULE_OF_TORCHTITAN:
        raise v.error(f'{key} = "{known[name.lower()]}": Tessel prices 1F1B, Interleaved1F1B, '
                      "GPipe and DualPipeV, not this schedule yet; use one of those")
    schedule = SCHEDULE_OF_TORCHTITAN[name.lower()]
    single = not schedule_info(schedule).multi_chunk
    parts = _parts(v, num_layers, pp, single, notes)
    if len(parts) % pp:
        raise v.error(f"{P}module_fqns_per_model_part has {len(parts)} parts, not a multiple "
                      f"of pipeline_parallel_degree {pp} (TorchTitan's rule)")
    virtual = len(parts) // pp
    if single and virtual != 1:
        raise v.error(f'{key} "{name}" runs one model part per rank, and the job has '
                      f"{len(parts)} parts on {pp} ranks; use Interleaved1F1B or {pp} parts")
    if not single and virtual < 2:
        raise v.error(f'{key} "{name}" runs two or more model parts per rank, and the job has '
                      f"{len(parts)} on {pp} ranks; use 1F1B or more parts")
    if schedule == "dualpipev" and virtual != 2:
        raise v.error(f'{key} "{name}" runs exactly two model parts per rank (torch\'s '
                      f"ScheduleDualPipeV), and the job has {len(parts)} on {pp} ranks; use "
                      f"{2 * pp} parts")
    _check_micro_batches(v, schedule, pp, micro_batches)
    counts = _layer_counts(v, parts, num_layers)
    if len(set(counts)) == 1:
        return schedule, virtual, None, None
    owner = [rank_of_part(c, pp, schedule in V_SHAPED) for c in range(len(counts))]
    return schedule, virtual, [sum(n for n, at in zip(counts, owner) if at == rank)
                               for rank in range(pp)], counts if virtual > 1 else None


def _check_micro_batches(v: _Values, schedule: str, pp: int, micro_batches: int) -> None:
    """torch's rules: 1F1B needs a micro-batch per stage; Interleaved1F1B cuts them into
    rounds of (about) one per rank."""
    fix = (f"raise training.local_batch_size or lower {P}pipeline_parallel_microbatch_size "
           f"(now {micro_batches} micro-batches)")
    if schedule == "1f1b" and micro_batches < pp:
        raise v.error(f"1F1B needs at least {pp} micro-batches, one per stage (torch's "
                      f"Schedule1F1B); {fix}")
    if schedule == "dualpipev" and micro_batches < 2 * pp:
        raise v.error(f"DualPipeV needs at least {2 * pp} micro-batches, one per stage "
                      f"(torch's ScheduleDualPipeV); {fix}")
    rounds = max(1, micro_batches // pp)
    if schedule == "interleaved" and micro_batches % rounds:
        raise v.error(f"Interleaved1F1B cuts {micro_batches} micro-batches into {rounds} equal "
                      f"rounds (torch's rule), which does not divide them; use a multiple of "
                      f"{pp} micro-batches")


def _counted(counts: list[int]) -> str:
    """'7, 9, 8, 8' (or its start for long lists)."""
    text = ", ".join(map(str, counts[:12]))
    return text + (", ..." if len(counts) > 12 else "")


def _parts(
    v: _Values, num_layers: int, pp: int, single: bool, notes: list[str]
) -> list[list[str]]:
    """The module names of every model part, as given or as TorchTitan generates them."""
    key = P + "module_fqns_per_model_part"
    given = v[key]
    if given is not None:
        if not isinstance(given, list) or not all(
                isinstance(part, list) and all(isinstance(n, str) for n in part)
                for part in given):
            raise v.error(f"{key} must be a list of lists of module names, e.g. "
                          '[["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]')
        return given
    first = v.whole(P + "pipeline_parallel_first_stage_less_layers", least=0)
    last = v.whole(P + "pipeline_parallel_last_stage_less_layers", least=0)
    per_stage = v[P + "pipeline_parallel_layers_per_stage"]
    if per_stage is None:
        stages = pp * (1 if single else 2)  # pipeline_llm's default stages per rank
    else:
        key = P + "pipeline_parallel_layers_per_stage"
        per_stage = v.whole(key)
        stages = math.ceil((num_layers + first + last) / per_stage)
        # pipeline_llm's checks of the stages it makes of it.
        if stages % pp or (single and stages != pp) or (not single and stages < 2 * pp):
            rule = ("a multiple of" if stages % pp else "equal to" if single
                    else "at least twice")
            raise v.error(f"{key} {per_stage} makes {stages} stages of the {num_layers} "
                          f"blocks (with the embedding and output weighing {first} and "
                          f"{last}), which must be {rule} pipeline_parallel_degree {pp} for "
                          f"this schedule (TorchTitan's rule); choose another")
    parts = _generated_parts(v, stages, num_layers, first, last)
    counts = _counted(_layer_counts(v, parts, num_layers))
    notes.append(f"pipeline parts as TorchTitan splits them: {counts} blocks (the embedding "
                 f"and the output weighing {first} and {last})")
    return parts


def _generated_parts(
    v: _Values, stages: int, num_layers: int, first: int, last: int
) -> list[list[str]]:
    """torchtitan.distributed.pipeline_parallel.generate_llm_fqn_per_model_part: the
    embedding weighs `first` layers and the norm and output `last`; the first stages take
    one layer more where the weighted layers do not divide."""
    if stages == 1:
        return [["tok_embeddings", *(f"layers.{i}" for i in range(num_layers)), "norm",
                 "output"]]
    counts = part_layers(num_layers, stages, first, last)
    if counts is None:
        raise v.error(f"{stages} pipeline stages of {num_layers} layers (the embedding and "
                      f"output weighing {first} and {last}) leave a stage without its share "
                      "(TorchTitan refuses it); use fewer stages")
    parts, layer = [], 0
    for stage, count in enumerate(counts):
        names = ["tok_embeddings"] if stage == 0 else []
        names += [f"layers.{i}" for i in range(layer, layer + count)]
        layer += count
        parts.append(names + (["norm", "output"] if stage == stages - 1 else []))
    return parts


def _layer_counts(v: _Values, parts: list[list[str]], num_layers: int) -> list[int]:
    """Blocks per part; JobConfigError unless the parts hold the embedding first, every
    block once in order, and the norm and output last, each part one block or more."""
    key = P + "module_fqns_per_model_part"
    order = ["tok_embeddings", *(f"layers.{i}" for i in range(num_layers)), "norm", "output"]
    flat = [name for part in parts for name in part]
    if flat != order:
        wrong = next((f'"{got}" where "{want}" belongs' for got, want in zip(flat, order)
                      if got != want), f"{len(flat)} modules of the {len(order)}")
        raise v.error(f"{key}: the parts must hold tok_embeddings, layers.0 .. "
                      f"layers.{num_layers - 1}, norm and output once each, in order; found "
                      f"{wrong}")
    counts = [sum(name.startswith("layers.") for name in part) for part in parts]
    if 0 in counts:
        raise v.error(f"{key}: part {counts.index(0)} holds no transformer block; Tessel "
                      "prices stages of one or more blocks")
    return counts


def _recompute(v: _Values, notes: list[str]) -> tuple[str, int]:
    """(recompute, every how many blocks one is checkpointed) of [activation_checkpoint]."""
    key = "activation_checkpoint."
    mode = v.text(key + "mode", ("selective", "full", "memory_budget", "none"))
    option = v.text(key + "selective_ac_option")
    if key + "mode" not in v.given:
        notes.append('activation checkpointing: TorchTitan\'s default, mode "selective" '
                     f'with selective_ac_option "{option}"')
    if mode == "memory_budget":
        raise v.error(f'{key}mode = "memory_budget" lets the compiler choose what to save, '
                      'which Tessel cannot price; use "none", "selective" or "full"')
    if mode in ("none", "full"):
        return mode, 1
    if option == "op":
        return "selective", 1  # op-level: the engine's rule of which outputs are saved
    if not option.isdigit():
        raise v.error(f'{key}selective_ac_option = "{option}" must be "op" or a whole number '
                      "k (every k-th block checkpointed), as TorchTitan requires")
    # _apply_layer_sac: 0 and 1 checkpoint every block, k every k-th.
    return "full", max(1, int(option))


def _precision(v: _Values, shard: int, notes: list[str]) -> tuple[str, str, bool]:
    """(matmul precision, fp8 recipe, fp8 all-gathers) of the converters and [training];
    `shard`: the data-parallel shard degree."""
    param = v.text("training.mixed_precision_param", ("bfloat16", "float32"))
    converters = v.names("model.converters")
    for name in converters:
        if name in ("float8", "mx"):
            raise v.error(f'model.converters "{name}": TorchTitan 0.2 registers it as '
                          f'"quantize.linear.{name}"; write converters = '
                          f'["quantize.linear.{name}"]')
        if name not in CONVERTERS:
            raise v.error(f'model.converters "{name}" is not a converter TorchTitan 0.2 '
                          f"registers ({', '.join(CONVERTERS)})")
        if name.startswith("quantize.grouped_mm."):
            notes.append(f'converter "{name}" has no effect: Llama 3 has no grouped GEMMs')
    linear = [name for name in converters if name.startswith("quantize.linear.")]
    if not linear:
        return ("bf16" if param == "bfloat16" else "fp32"), "tensorwise", False
    if len(linear) > 1:
        raise v.error(f"model.converters {shown(linear)}: TorchTitan cannot combine float8 "
                      "and MX converters; keep one")
    if param != "bfloat16":
        raise v.error(f'{linear[0]} with training.mixed_precision_param = "{param}": Tessel '
                      "prices fp8 matmuls with bf16 elsewhere; use bfloat16")
    table = linear[0] + "."
    _filtered(v, table + "filter_fqns", notes)
    if linear[0] == "quantize.linear.mx":
        recipe = v.text(table + "recipe_name")
        if not recipe.startswith("mxfp8") or "emulated" in recipe:
            raise v.error(f'{table}recipe_name = "{recipe}": Tessel prices MX training in '
                          'mxfp8 on tensor cores; use "mxfp8_cublas"')
        return "fp8", "mxfp8", False
    recipe = v[table + "recipe_name"]
    if recipe not in (None, "tensorwise", "rowwise", "rowwise_with_gw_hp"):
        raise v.error(f"{table}recipe_name = {shown(recipe)} must be tensorwise, rowwise or "
                      "rowwise_with_gw_hp")
    if recipe == "rowwise_with_gw_hp":
        raise v.error(f'{table}recipe_name = "{recipe}": weight gradients in 16 bits beside '
                      "fp8 matmuls is a mix Tessel cannot price yet; use rowwise or "
                      "tensorwise")
    gather = v.flag(table + "enable_fsdp_float8_all_gather")
    if gather and recipe is not None:
        raise v.error(f"{table}enable_fsdp_float8_all_gather = true with recipe_name "
                      f'"{recipe}": TorchTitan refuses the two together; leave recipe_name '
                      "unset (tensorwise)")
    v.flag(table + "precompute_float8_dynamic_scale_for_fsdp")  # one amax per step: no price
    if gather and shard == 1:
        # Float8LinearConverter: fp8 all-gathers only where the shard degree is above 1.
        notes.append("enable_fsdp_float8_all_gather has no effect: data_parallel_shard_degree "
                     "is 1")
    if recipe == "rowwise":
        notes.append("row-wise float8 is priced by its casts (two per input, rows and "
                     "columns) at the fp8 matmul efficiency fitted on per-tensor runs; no "
                     "published row-wise run was there to check it")
        return "fp8", "rowwise", False
    return "fp8", "tensorwise", gather and shard > 1


def _filtered(v: _Values, key: str, notes: list[str]) -> None:
    """Linear layers kept out of fp8: none, or the output layer, which Tessel prices in fp8
    like the rest (a note says so); others are refused."""
    names = v.names(key)
    if names not in FILTERS:
        raise v.error(f"{key} = {shown(names)}: Tessel prices every block linear in fp8; "
                      'use [] or ["output"]')
    if names:
        notes.append(f'{key} ["output"]: TorchTitan keeps the output layer in bf16; Tessel '
                     "prices it in fp8 like the blocks' linears")


def _compile(v: _Values) -> tuple[bool, bool]:
    """(blocks, loss): whether TorchTitan compiles each block (`model_compile_enabled`)
    and the loss (`loss_compile_enabled`)."""
    enabled = v.flag("compile.enable")
    components = v.names("compile.components")
    unknown = [c for c in components if c not in ("model", "loss")]
    if enabled and unknown:
        raise v.error(f"compile.components {shown(components)}: TorchTitan compiles "
                      '"model" and "loss"; remove the others')
    return enabled and "model" in components, enabled and "loss" in components
