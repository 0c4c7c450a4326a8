"""Fixed parallel knobs checked against the model and the cluster before any search.

A knob a user fixes is kept by every search space, so a value that no plan can honour
must be refused up front, with the rule it breaks and the flag as typed, rather than
searched into "no plan fits" or, worse, into a plan that Megatron-LM would reject at
launch. The rules are Megatron-LM's (`validate_args` and the parallel-state setup):
tensor parallelism splits attention heads and key/value groups and stays within a node,
pipeline stages hold at least one layer, context parallelism splits the sequence into
2 x degree chunks, expert parallelism needs experts to split, and every data-parallel
replica needs whole micro-batches.
"""

from __future__ import annotations

from planner.vocabulary.cluster import Cluster
from planner.models.config import TransformerConfig
from planner.vocabulary.knobs import KNOBS, spelt
from planner.vocabulary.parallel import ADAPTER_FINETUNES, PRECISIONS, QLORA_PRECISIONS, FixedKnobs
from planner.vocabulary.schedules import runs_on
from planner.search.megatron_space import SearchSpace, data_degrees

# Knob -> the `plan` flag that fixes it, for messages that name the flag as typed.
FLAG = {name: spelling.key for name, spelling in spelt("cli").items()}


def check_knobs(
    knobs: FixedKnobs, model: TransformerConfig, cluster: Cluster,
    global_batch_size: int, space: SearchSpace,
) -> None:
    """ValueError naming every fixed knob that no plan of `space` can honour on `cluster`
    (its GPU count already set) for `model`, each with its rule."""
    problems = _degree_problems(knobs, model, cluster)
    precision = knobs.get("precision", default_precision(cluster))
    if precision not in cluster.device.peak_tflops:
        has = ", ".join(sorted(k for k in cluster.device.peak_tflops if k in PRECISIONS))
        problems.append(
            f"{FLAG['precision']} {precision} needs {precision} tensor cores, which "
            f"{cluster.device.name} lacks; use one it has ({has}) or a newer cluster"
        )
    problems += _run_problems(knobs, model, cluster, precision)
    problems += _offload_problems(knobs, model, cluster, precision)
    problems += _schedule_problems(knobs, model, space)
    engine = knobs.get("engine", "megatron")
    problems += [f"{FLAG.get(name, name)} is {' and '.join(KNOBS[name].engines)}'s, not "
                 f"--engine {engine}'s; drop it" for name in knobs
                 if engine not in KNOBS[name].engines]
    if not problems:
        problems += _batch_problems(knobs, model, cluster, global_batch_size)
    if problems:
        raise ValueError("; ".join(problems) + ".")


def default_precision(cluster: Cluster) -> str:
    """The matmul precision a plan uses unless told (`DeviceSpec.default_precision`)."""
    return cluster.device.default_precision


def _degree_problems(
    knobs: FixedKnobs, model: TransformerConfig, cluster: Cluster
) -> list[str]:
    n, per_node = cluster.num_devices, min(cluster.devices_per_node, cluster.num_devices)
    heads, groups = model.num_attention_heads, model.num_kv_heads
    problems = []
    t, c, p = knobs.get("tensor", 1), knobs.get("context", 1), knobs.get("pipeline", 1)
    if heads % t or groups % t or per_node % t:
        of_groups = f", the {groups} key/value groups" if groups != heads else ""
        # A domain of several hosts (a 72-GPU NVL72 rack of 4-GPU trays) is no "node" to
        # its users; a tensor group must stay inside the domain, not the host.
        node = "a node" if cluster.devices_per_host >= per_node else "an NVLink domain"
        problems.append(
            f"{FLAG['tensor']} {t} must divide the {heads} attention heads{of_groups} and "
            f"the {per_node} GPUs of {node}"
        )
    if c > 1 and (n % c or model.seq_length % (2 * c)):
        problems.append(
            f"{FLAG['context']} {c} must divide the {n} GPUs and split the "
            f"{model.seq_length}-token sequence into {2 * c} equal chunks"
        )
    if p > model.num_layers:
        problems.append(
            f"{FLAG['pipeline']} {p} is more than the model's {model.num_layers} layers; "
            f"each stage needs at least one"
        )
    if not problems and n % (t * c * p):
        problems.append(
            f"tensor ({t}) x context ({c}) x pipeline ({p}) must divide the {n} GPUs"
        )
    e = knobs.get("expert", 1)
    etp = knobs.get("expert_tensor")
    if e > 1 and etp and model.num_experts and n % (e * etp * p):
        problems.append(
            f"{FLAG['expert']} {e} x {FLAG['expert_tensor']} {etp} x {FLAG['pipeline']} {p} "
            f"must divide the {n} GPUs")
    if etp and model.num_experts and (n % etp or model.expert_ffn_size % etp):
        # Each expert's MLP splits by columns over its expert-tensor group (Megatron-Core's
        # expert TP), which must tile the GPUs.
        problems.append(
            f"{FLAG['expert_tensor']} {etp} must divide the {n} GPUs and the experts' "
            f"{model.expert_ffn_size}-wide MLP")
    if e > 1 and not model.num_experts:
        problems.append(
            f"{FLAG['expert']} {e} needs a mixture-of-experts model, and this one is dense "
            "(no --num-experts)"
        )
    elif e > 1 and model.num_experts % e:
        problems.append(
            f"{FLAG['expert']} {e} must divide the model's {model.num_experts} experts"
        )
    # Groups that exchange activations every layer stay inside one data centre.
    for name, stride, size in (("tensor", 1, t), ("context", t, c),
                               ("expert", knobs.get("expert_tensor") or t, e)):
        wan = cluster.crosses_wan(stride, size) if name in knobs and size > 1 else None
        if wan:
            problems.append(
                f"{FLAG[name]} {size}: its groups of {stride * size} ranks would cross the "
                f"WAN tier {wan!r} between data centres; keep tensor, context and expert "
                "groups inside one data centre (a smaller degree) and cross it with "
                "pipeline or data parallelism")
    sp = knobs.get("sequence_parallel")
    if sp and knobs.get("tensor") == 1:
        problems.append(
            f"{FLAG['sequence_parallel']} shards over the tensor-parallel group, which "
            f"{FLAG['tensor']} 1 leaves with one GPU; drop one of the two"
        )
    if sp is False and e > 1 and knobs.get("tensor", 1) > 1:
        problems.append(
            "--no-sequence-parallel with expert and tensor parallelism: Megatron-LM needs "
            "sequence parallelism there"
        )
    return problems


def _run_problems(knobs: FixedKnobs, model: TransformerConfig, cluster: Cluster,
                  precision: str) -> list[str]:
    """Settings that need something of the device, the model or another knob."""
    problems = []
    device = cluster.device
    backend = knobs.get("attention_backend")
    if backend in ("flash", "fused") and not device.flash_attention:
        problems.append(
            f"{FLAG['attention_backend']} {backend} needs fused attention kernels, which "
            f"{device.name} cannot run; use local or unfused"
        )
    recipe = knobs.get("fp8_recipe")
    if recipe is not None and precision != "fp8":
        problems.append(f"{FLAG['fp8_recipe']} {recipe} applies to fp8 matmuls; add "
                        f"{FLAG['precision']} fp8 or drop it")
    if recipe == "mxfp8" and "mxfp8" not in device.peak_tflops:
        problems.append(f"{FLAG['fp8_recipe']} mxfp8 needs Blackwell's block-scaled fp8 "
                        f"tensor cores, which {device.name} lacks; use delayed or tensorwise")
    if knobs.get("tp_comm_overlap") and (knobs.get("sequence_parallel") is False
                                        or knobs.get("tensor") == 1):
        problems.append(f"{FLAG['tp_comm_overlap']} overlaps the all-gathers and "
                        f"reduce-scatters of sequence parallelism; it needs "
                        f"{FLAG['sequence_parallel']} and {FLAG['tensor']} above 1")
    zero = knobs.get("zero_stage")  # None: searched, so no rule of it is broken yet
    if knobs.get("overlap_param_gather") and ((zero is not None and zero < 1)
                                             or knobs.get("overlap_grad_reduce") is False):
        problems.append(f"{FLAG['overlap_param_gather']} gathers the distributed "
                        f"optimizer's weights: it needs --use-distributed-optimizer (or "
                        f"{FLAG['zero_stage']} 1 or more) and {FLAG['overlap_grad_reduce']}")
    method = "recompute_method" in knobs or "recompute_num_layers" in knobs
    if method and knobs.get("recompute") != "full":
        problems.append(f"{FLAG['recompute_method']} and {FLAG['recompute_num_layers']} "
                        f"choose which layers full recomputation replays; they need "
                        f"{FLAG['recompute']} full")
    moe_only = [FLAG[k] if knobs[k] is True else f"{FLAG[k]} {knobs[k]}"
                for k in ("moe_token_dispatcher", "expert_tensor",
                          "overlap_moe_expert_parallel_comm", "moe_expert_capacity_factor")
                if knobs.get(k)]
    if moe_only and not model.num_experts:
        problems.append(f"{', '.join(moe_only)} set how tokens reach experts, and this model "
                        "is dense (no --num-experts); drop them")
    if knobs.get("overlap_moe_expert_parallel_comm") and (
            knobs.get("expert") == 1 or knobs.get("moe_token_dispatcher") == "allgather"
            or knobs.get("recompute") == "full"):
        problems.append(f"{FLAG['overlap_moe_expert_parallel_comm']} overlaps expert "
                        f"all-to-alls: it needs {FLAG['expert']} above 1, the alltoall or flex "
                        f"dispatcher and no full recomputation (Megatron-LM's rule)")
    return problems


def _offload_problems(knobs: FixedKnobs, model: TransformerConfig, cluster: Cluster,
                      precision: str) -> list[str]:
    """Offload and fine-tuning settings the cluster, the model or the other knobs rule out."""
    problems = []
    fraction = knobs.get("optimizer_offload_fraction")
    if fraction is not None and not 0 <= fraction <= 1:
        problems.append(f"{FLAG['optimizer_offload_fraction']} {fraction:g} must be within "
                        "[0, 1]: the share of the optimizer's state on the CPU")
    elif fraction is not None and fraction < 1 and knobs.get("offload_optimizer") != "cpu":
        problems.append(f"{FLAG['optimizer_offload_fraction']} {fraction:g} splits the "
                        f"optimizer between CPU and GPU; add {FLAG['offload_optimizer']} cpu")
    targets = [knobs.get(name) for name in ("offload_optimizer", "offload_params")]
    offloaded = [t for t in targets if t not in (None, "none")]
    if knobs.get("offload_checkpoints") and knobs.get("recompute") != "full":
        problems.append(f"{FLAG['offload_checkpoints']} offloads the inputs full "
                        f"recomputation keeps; add {FLAG['recompute']} full")
    if offloaded or knobs.get("offload_activation_layers") or knobs.get("offload_checkpoints"):
        host = cluster.host
        if host is None:
            problems.append(f"cluster {cluster.name!r} has no host figures (host memory, "
                            "PCIe, NVMe), so offload cannot be priced; add a host: section "
                            "to its file")
        elif "nvme" in offloaded and (host.nvme_read_gbs is None or host.nvme_write_gbs
                                      is None or host.nvme_tb is None):
            problems.append(f"offload to nvme needs the cluster's NVMe figures, and "
                            f"{cluster.name!r} has none; add host.nvme_read_gbs, "
                            "nvme_write_gbs and nvme_tb to its file, or offload to cpu")
    if knobs.get("offload_params", "none") != "none" and knobs.get("zero_stage", 3) != 3:
        problems.append(f"{FLAG['offload_params']} {knobs['offload_params']} offloads ZeRO-3's "
                        f"parameter shards; it needs {FLAG['zero_stage']} 3")
    layers = knobs.get("offload_activation_layers")
    if layers is not None and knobs.get("engine", "megatron") == "megatron" \
            and layers >= model.num_layers:
        # Megatron-Core's TransformerConfig.__post_init__; torchtune offloads every layer.
        problems.append(f"{FLAG['offload_activation_layers']} {layers} must be fewer than the "
                        f"model's {model.num_layers} layers")
    elif layers is not None and layers > model.num_layers:
        problems.append(f"{FLAG['offload_activation_layers']} {layers} must be at most the "
                        f"model's {model.num_layers} layers")
    finetune = knobs.get("finetune", "none")
    adapters = finetune in ADAPTER_FINETUNES
    given = [FLAG[name] for name in ("lora_rank", "lora_alpha", "lora_targets") if name in knobs]
    if given and not adapters:
        problems.append(f"{', '.join(given)} set the adapters of --finetune lora or qlora; "
                        "add one or drop them")
    rank = knobs.get("lora_rank")
    if rank is not None and not 1 <= rank <= model.hidden_size:
        problems.append(f"{FLAG['lora_rank']} {rank} must be from 1 to the hidden size "
                        f"({model.hidden_size})")
    if finetune == "qlora" and precision not in QLORA_PRECISIONS:
        problems.append(f"--finetune qlora dequantizes its 4-bit base to bf16 or fp16 for each "
                        f"matmul, and {FLAG['precision']} {precision} has no 4-bit path; use "
                        "--precision bf16")
    return problems


def _schedule_problems(knobs: FixedKnobs, model: TransformerConfig,
                       space: SearchSpace) -> list[str]:
    problems = []
    schedule, p = knobs.get("schedule"), knobs.get("pipeline")
    if schedule == "interleaved" and p == 1:
        problems.append(
            f"{FLAG['schedule']} interleaved needs pipeline stages to interleave, and "
            f"{FLAG['pipeline']} 1 has one"
        )
    if schedule == "dualpipev":
        if p == 1:
            problems.append(f"{FLAG['schedule']} dualpipev needs pipeline stages, and "
                            f"{FLAG['pipeline']} 1 has one")
        if not runs_on(schedule, knobs.get("engine")):
            problems.append(
                f"{FLAG['schedule']} dualpipev is TorchTitan's and Tessel's runtime's, not "
                "Megatron-LM's (it has no DualPipe schedule); add --engine torchtitan or "
                "--engine tessel")
    if space == "megatron" and schedule == "gpipe":
        problems.append(
            f"{FLAG['schedule']} gpipe is not in --space megatron (Megatron-LM runs 1f1b and "
            "interleaved); use --space auto"
        )
    # TorchTitan's FSDP2 is ZeRO-3 on the one mesh the Megatron space lays out.
    zero = knobs.get("zero_stage")  # None: searched
    if space == "megatron" and zero is not None and zero > 1 \
            and knobs.get("engine") != "torchtitan":
        problems.append(
            f"{FLAG['zero_stage']} {knobs['zero_stage']} is not in --space megatron "
            "(Megatron-LM shards optimizer state only: stage 0 or 1); use --space auto"
        )
    return problems


def _batch_problems(
    knobs: FixedKnobs, model: TransformerConfig, cluster: Cluster, gbs: int
) -> list[str]:
    mb = knobs.get("micro_batch_size", 1)
    if gbs % mb:
        return [
            f"{FLAG['micro_batch_size']} {mb} must divide --global-batch-size {gbs}"
        ]
    degrees = data_degrees(model, cluster, knobs)
    if not degrees:
        fixed = ", ".join(f"{FLAG[k]} {v}" for k, v in knobs.items()
                          if k in ("tensor", "pipeline", "context", "expert"))
        return [f"no layout of {cluster.num_devices} GPUs has {fixed}: the data-parallel "
                "replicas left must split the experts evenly"]
    if any(gbs % (mb * d) == 0 for d in degrees):
        return []
    least = min(degrees)
    per = f"{mb} x " if mb > 1 else ""
    return [
        f"--global-batch-size {gbs} cannot be split over the data-parallel replicas: every "
        f"layout of {cluster.num_devices} GPUs with these knobs has {least} or more, each "
        f"needing {'micro-batches of ' + str(mb) if mb > 1 else 'whole sequences'}; use a "
        f"multiple of {per}{least} or fewer --gpus"
    ]
