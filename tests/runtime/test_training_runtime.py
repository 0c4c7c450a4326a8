"""runtime's training-plan path: mesh axes, stage split, schedule mapping and per-parameter
init without processes; a few small multi-rank runs (4-layer GPT / Llama, hidden 64, seq
16, K=2 SGD steps) compared with one process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor

from planner.models.config import TransformerConfig
from planner.vocabulary.parallel_dims import ParallelDims
from runtime.mesh import AXES, build_mesh
from runtime.parallelize import apply_data_parallel, apply_recompute, apply_tensor_parallel
from runtime.schedule import schedule_class
from runtime.spec import RunSpec, even_chunks, from_training_plan
from runtime.stages import build_reference, build_stage, init_parameter, materialize
from planner.checks.training_check import TrainingCheck, check_training

GPT = TransformerConfig(  # tied embeddings, as GPT and Megatron default to
    num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16,
)
UNTIED_GPT = GPT.model_copy(update={"tie_embeddings": False})
LLAMA = TransformerConfig(
    num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2, vocab_size=256,
    seq_length=16, norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=False,
    tie_embeddings=False,
)
MIXTRAL = LLAMA.model_copy(update={"num_experts": 4, "moe_top_k": 2})
TOLERANCE = 1e-4


def _spec(pp=1, dp=1, tp=1, cp=1, virtual=1, micro_batches=4, expert=1, **knobs) -> RunSpec:
    return RunSpec(
        degrees=ParallelDims(pipeline=pp, data=dp, context=cp, tensor=tp, expert=expert),
        chunks=even_chunks(4, pp * virtual),
        micro_batch_size=1, num_micro_batches=micro_batches, virtual_pipeline=virtual,
        **knobs,
    )


# ----- without processes -------------------------------------------------------------


def test_mesh_axes_put_tensor_fastest_and_pipeline_slowest() -> None:
    assert AXES == ("pp", "dp", "cp", "tp")
    d = ParallelDims(pipeline=2, data=2, tensor=2)
    assert d.shape == (2, 2, 1, 2) and d.world_size == 8
    assert d.coordinates(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    assert d.group(5, "tp") == [4, 5]
    assert d.group(5, "dp") == [5, 7]
    assert d.group(5, "pp") == [1, 5]
    with pytest.raises(ValueError, match="outside"):
        d.coordinates(8)


def test_device_mesh_groups_match_megatron_rank_order(fake_world) -> None:
    fake_world(5, 8)
    d = ParallelDims(pipeline=2, data=2, tensor=2)
    mesh = build_mesh(d)
    assert mesh.mesh_dim_names == AXES
    for axis in ("pp", "dp", "tp"):
        assert dist.get_process_group_ranks(mesh[axis].get_group()) == d.group(5, axis)


def test_stage_split_and_interleaved_ownership() -> None:
    assert even_chunks(4, 2) == ((0, 2), (2, 4))
    assert even_chunks(5, 2) == ((0, 3), (3, 5))
    spec = _spec(pp=2, virtual=2, schedule="interleaved")
    assert spec.chunks == ((0, 1), (1, 2), (2, 3), (3, 4))
    assert spec.stage_indices(0) == [0, 2] and spec.stage_indices(1) == [1, 3]
    assert spec.global_batch_size == 4
    assert [spec.stage_rank(c) for c in range(4)] == [0, 1, 0, 1]
    zbv = _spec(pp=2, virtual=2, schedule="zbv")  # V order: 0 1 | 1 0
    assert zbv.stage_indices(0) == [0, 3] and zbv.stage_indices(1) == [1, 2]
    assert [zbv.stage_rank(c) for c in range(4)] == [0, 1, 1, 0]
    with pytest.raises(ValueError, match="exactly 2 chunks"):
        _spec(pp=2, virtual=1, schedule="zbv")
    dualpipev = _spec(pp=2, virtual=2, schedule="dualpipev")  # DualPipeV: the same V
    assert dualpipev.stage_indices(0) == [0, 3] and dualpipev.stage_indices(1) == [1, 2]
    with pytest.raises(ValueError, match=r"at least as many micro-batches \(3\) as stages \(4\)"):
        _spec(pp=2, virtual=2, schedule="dualpipev", micro_batches=3)
    with pytest.raises(ValueError, match="exactly 2 chunks"):
        _spec(pp=1, virtual=4, schedule="dualpipev")
    with pytest.raises(ValueError, match="1F1B needs at least"):
        _spec(pp=4, micro_batches=2, schedule="1f1b")
    with pytest.raises(ValueError, match="virtual stages need an interleaved"):
        RunSpec(degrees=ParallelDims(pipeline=2), chunks=even_chunks(4, 4), micro_batch_size=1,
                num_micro_batches=2, virtual_pipeline=2)


def test_run_spec_from_a_training_plan() -> None:
    plan = SimpleNamespace(
        parallel=SimpleNamespace(
            data=2, tensor=2, pipeline=2, context=1, expert=1, sequence_parallel=True,
            zero_stage=1, virtual_pipeline=2,
        ),
        stages=[SimpleNamespace(layers=(0, 4)), SimpleNamespace(layers=(4, 8))],
        micro_batch_size=1, num_micro_batches=4, recompute="selective", schedule="interleaved",
        global_batch_size=8,
    )
    spec = from_training_plan(plan)
    assert spec.degrees == ParallelDims(pipeline=2, data=2, tensor=2)
    assert spec.chunks == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert (spec.zero_stage, spec.recompute, spec.sequence_parallel) == (1, "selective", True)
    plan.global_batch_size = 16
    with pytest.raises(ValueError, match="global batch"):
        from_training_plan(plan)
    plan.global_batch_size = 8
    plan.stages[1].mesh_shape = [4, 1]
    with pytest.raises(ValueError, match="stage 1 runs on a 4x1 mesh"):
        from_training_plan(plan)
    with pytest.raises(ValueError, match="operator-level"):
        from_training_plan(SimpleNamespace(parallel=None))


def test_run_spec_from_a_real_interleaved_plan() -> None:
    """The Plan lists each stage's chunks in Megatron's interleaved order, and the runtime
    runs exactly those: 8 layers, 2 stages x 2 chunks of 2 layers, chunk c on stage c % 2."""
    from planner.vocabulary.cluster import Cluster
    from planner.vocabulary.parallel import ParallelConfig
    from planner.plans.transformer_plan import training_plan

    model = GPT.model_copy(update={"num_layers": 8})
    parallel = ParallelConfig.of(tensor=2, pipeline=2, micro_batch_size=1, global_batch_size=8,
                              schedule="interleaved", virtual_pipeline=2, precision="fp32")
    plan = training_plan("gpt", model, Cluster.load("cpu").with_devices(8), parallel)
    assert [s.chunks for s in plan.stages] == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]
    spec = from_training_plan(plan)
    assert spec.chunks == ((0, 2), (2, 4), (4, 6), (6, 8)) == even_chunks(8, 4)
    assert spec.stage_indices(0) == [0, 2] and spec.stage_indices(1) == [1, 3]


def test_schedule_names_map_to_torch_schedules() -> None:
    assert schedule_class("gpipe", 1) is ScheduleGPipe
    assert schedule_class("1f1b", 1) is Schedule1F1B
    assert schedule_class("interleaved", 2) is ScheduleInterleaved1F1B
    assert schedule_class("interleaved_zb", 2) is ScheduleInterleavedZeroBubble
    assert schedule_class("zbv", 2) is ScheduleZBVZeroBubble
    assert schedule_class("dualpipev", 2) is ScheduleDualPipeV
    with pytest.raises(ValueError, match="virtual"):
        schedule_class("interleaved", 1)


@pytest.mark.parametrize("config", [GPT, UNTIED_GPT, LLAMA], ids=["gpt", "untied", "llama"])
def test_stages_get_the_single_process_values_and_compute_the_same(config) -> None:
    reference = build_reference(config, seed=3)
    want = dict(reference.named_parameters())
    first = build_stage(config, (0, 2), first_stage=True, last_stage=False)
    last = build_stage(config, (2, 4), first_stage=False, last_stage=True)
    got = {}
    for stage in (first, last):
        materialize(stage, seed=3)
        got.update(dict(stage.named_parameters()))
    assert not any(name.startswith("layers.2") for name, _ in first.named_parameters())
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    if config.tie_embeddings:  # the last stage holds its own copy of the tied embedding
        assert torch.equal(last.embed.weight, first.embed.weight)
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length))
    with torch.no_grad():
        torch.testing.assert_close(last(first(tokens)), reference(tokens), rtol=0, atol=0)


def test_init_depends_on_name_and_seed_only() -> None:
    a = init_parameter("layers.0.attn.q_proj.weight", (8, 8), seed=0)
    assert torch.equal(a, init_parameter("layers.0.attn.q_proj.weight", (8, 8), seed=0))
    assert not torch.equal(a, init_parameter("layers.1.attn.q_proj.weight", (8, 8), seed=0))
    assert not torch.equal(a, init_parameter("layers.0.attn.q_proj.weight", (8, 8), seed=1))
    assert torch.equal(init_parameter("layers.0.mlp_norm.weight", (8,), 0), torch.ones(8))
    assert torch.equal(init_parameter("layers.0.mlp.fc1.bias", (8,), 0), torch.zeros(8))


def test_a_rank_materializes_only_its_tensor_and_data_parallel_shards(fake_world) -> None:
    # Rank 5 of pp2.dp2.tp2: pipeline rank 1, data rank 0, tensor rank 1.
    fake_world(5, 8)
    mesh = build_mesh(ParallelDims(pipeline=2, data=2, tensor=2))
    stage = build_stage(GPT, (2, 4), first_stage=False, last_stage=True)
    apply_tensor_parallel(stage, mesh["tp"], sequence_parallel=True)
    apply_data_parallel(stage, mesh["dp"], zero_stage=3)
    materialize(stage, seed=0)
    full = dict(build_reference(GPT, seed=0).named_parameters())
    q = stage.layers["2"].attn.q_proj.weight  # column-parallel, then FSDP on dim 0
    o = stage.layers["2"].attn.o_proj.weight  # row-parallel (dim 1), FSDP on dim 0
    assert isinstance(q, DTensor) and isinstance(o, DTensor)
    want_q = full["layers.2.attn.q_proj.weight"].chunk(2, 0)[1].chunk(2, 0)[0]
    want_o = full["layers.2.attn.o_proj.weight"].chunk(2, 1)[1].chunk(2, 0)[0]
    assert torch.equal(q.to_local(), want_q)
    assert torch.equal(o.to_local(), want_o)
    local = sum(p.to_local().numel() for p in stage.parameters())
    whole = sum(full[n].numel() for n, _ in stage.named_parameters())
    # Norms are replicated over tp, everything else split four ways.
    assert whole / 4 <= local < whole / 3


# ----- multi-rank: trained on local gloo ranks, compared with one process ---------------


def _train(
    config: TransformerConfig, spec: RunSpec, steps: int = 2, optimizer: str = "sgd",
) -> TrainingCheck:
    check = check_training(config, spec, steps, optimizer=optimizer)
    for coords, kinds, held in zip(check.coordinates, check.collectives, check.local_bytes):
        print(coords, kinds, held)
    print(f"losses {check.losses} vs {check.reference_losses}; rel err loss "
          f"{check.loss_max_rel_error:.2e}, parameters {check.parameter_rel_error:.2e}")
    assert check.passed(TOLERANCE)
    assert check.losses[1] != check.losses[0]  # the step moved the model
    return check


def test_pp2_tp2_dp2_1f1b_trains_as_one_process() -> None:
    check = _train(GPT, _spec(pp=2, dp=2, tp=2, schedule="1f1b", zero_stage=1))
    for kinds in check.collectives:
        # 1F1B moves activations forward and gradients back; FSDP reduce-scatters and
        # all-gathers; tensor parallelism all-reduces.
        assert kinds["send"]["count"] > 0 and kinds["recv"]["count"] > 0
        assert {"all_gather", "reduce_scatter", "all_reduce"} <= set(kinds)
    # Steady state (step 2) on the first stage: 4 micro-batches of activations out, each
    # tensor rank its half of the sequence (Megatron's scatter-gather: [1, 8, 64] fp32 =
    # 2 KiB), 4 of their gradients back; nothing else on the wire.
    # Each collective on its axis (rank 0: tp group [0, 1], dp [0, 2], pp [0, 4]).
    groups = {(g["kind"], tuple(g["ranks"])) for g in check.collectives_by_group[0]}
    assert {("all_reduce", (0, 1)), ("reduce_scatter", (0, 2)), ("all_gather", (0, 2)),
            ("send", (0, 4)), ("recv", (0, 4))} <= groups, groups
    second = check.collectives_per_step[0][1]
    assert second["send"] == {"count": 4, "bytes": 4 * 2048}
    assert second["recv"] == {"count": 4, "bytes": 4 * 2048}


def test_tp2_dp2_sequence_parallel_llama_trains_as_one_process() -> None:
    check = _train(LLAMA, _spec(dp=2, tp=2, sequence_parallel=True, recompute="selective"))
    for kinds in check.collectives:
        # Sequence parallelism: row-parallel outputs reduce-scattered, block inputs gathered.
        assert kinds["reduce_scatter"]["count"] > 0
        assert "send" not in kinds


def test_pp2_dp2_interleaved_trains_as_one_process() -> None:
    _train(UNTIED_GPT, _spec(pp=2, dp=2, virtual=2, schedule="interleaved", recompute="full"))


def test_pp2_dp2_zbv_zero_bubble_trains_as_one_process() -> None:
    # Zero-bubble weight gradients are written by hand: FSDP2 still reduces them (DDP would
    # not, trap 1). The tied embedding's two copies are both on pipeline rank 0 (V order).
    _train(GPT, _spec(pp=2, dp=2, virtual=2, schedule="zbv", zero_stage=1))


def test_a_dualpipev_plan_of_the_zoo_llama_trains_as_one_process() -> None:
    # DeepSeek's DualPipeV (torch's ScheduleDualPipeV) from a Plan: pipeline 2 x data 2,
    # 4 chunks in V order (rank 0 holds the first and the last: the embedding and the
    # head), 4 micro-batches (torch asks one per stage at least), FSDP2 reducing the
    # hand-written weight gradients of its split backwards.
    from planner.vocabulary.cluster import Cluster
    from planner.vocabulary.parallel import ParallelConfig
    from planner.plans.transformer_plan import training_plan

    parallel = ParallelConfig.of(pipeline=2, data=2, micro_batch_size=1, global_batch_size=8,
                              schedule="dualpipev", virtual_pipeline=2, zero_stage=1,
                              precision="fp32", engine="tessel")
    plan = training_plan("llama", LLAMA, Cluster.load("cpu").with_devices(4), parallel)
    assert [s.chunks for s in plan.stages] == [[(0, 1), (3, 4)], [(1, 2), (2, 3)]]
    spec = from_training_plan(plan)
    assert (spec.schedule, spec.num_micro_batches, spec.degrees) == (
        "dualpipev", 4, ParallelDims(pipeline=2, data=2))
    assert spec.stage_indices(0) == [0, 3] and spec.stage_indices(1) == [1, 2]
    _train(LLAMA, spec)


def test_dp4_zero3_adamw_trains_as_one_process_and_shards_every_parameter() -> None:
    check = _train(
        GPT, _spec(dp=4, micro_batches=2, schedule="gpipe", zero_stage=3), optimizer="adamw"
    )
    whole = sum(p.numel() * 4 for p in build_reference(GPT, 0).parameters())
    assert sum(h["parameters"] for h in check.local_bytes) == whole
    assert sum(h["gradients"] for h in check.local_bytes) == whole
    for held in check.local_bytes:  # AdamW: two moments per parameter element
        assert held["optimizer"] == 2 * held["parameters"]
        assert held["parameters_gathered"] == whole
    for kinds in check.collectives:
        assert set(kinds) == {"all_gather", "reduce_scatter"}


def _listening_sockets_of_this_job(rank: int, world_size: int) -> list[str]:
    """Listening TCP sockets of this rank and of the elastic agent above it, as
    'address:port' (read from `ss`, which names the owning pids)."""
    import os
    import subprocess

    dist.barrier()  # every rank's gloo pairs are up
    pids = {os.getpid(), os.getppid()}
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    found = [
        line.split()[3] for line in lines
        if any(f"pid={pid}," in line for pid in pids)
    ]
    dist.barrier()
    return found


def test_elastic_launch_listens_on_loopback_only() -> None:
    from runtime.elastic import launch

    for sockets in launch(_listening_sockets_of_this_job, 2):
        assert all(address.startswith(("127.0.0.1:", "[::1]:")) for address in sockets), sockets


def _fail_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    return rank


def test_a_failing_rank_is_reported_by_the_launcher() -> None:
    from runtime.elastic import launch
    from runtime.local_ranks import RankError

    with pytest.raises(RankError, match="rank 1 failed: .*rank one fails on purpose") as info:
        launch(_fail_on_rank_one, 2, collective_timeout_s=10)
    assert "_fail_on_rank_one" in info.value.rank_traceback


@pytest.mark.parametrize("recompute, blocks, cores", [
    ("none", 4, 4), ("full", 8, 8), ("selective", 4, 8),
])
def test_recomputation_reruns_the_blocks_or_only_the_attention_cores(
    monkeypatch, recompute, blocks, cores,
) -> None:
    import runtime.stages as stages

    calls = {"blocks": 0, "cores": 0}
    core = stages._attention_core

    def counted_core(q, k, v, mask=None):
        calls["cores"] += 1
        return core(q, k, v, mask)

    monkeypatch.setattr(stages, "_attention_core", counted_core)
    stage = build_stage(GPT, (0, 4), first_stage=True, last_stage=True)
    apply_recompute(stage, recompute)
    materialize(stage, seed=0)
    for block in stage.layers.values():
        # A pre-hook: non-reentrant recomputation stops early, before the MLP returns.
        block.mlp.register_forward_pre_hook(
            lambda *_: calls.__setitem__("blocks", calls["blocks"] + 1)
        )
    tokens = torch.randint(0, GPT.vocab_size, (2, GPT.seq_length))
    stage(tokens).sum().backward()
    assert (calls["blocks"], calls["cores"]) == (blocks, cores)


def test_expert_parallel_ranks_hold_only_their_experts_under_full_names(fake_world) -> None:
    from runtime.experts import apply_expert_parallel, expert_mesh

    fake_world(3, 4)  # dp4, ep2: data rank 3 is expert rank 1 of expert-data group 1
    mesh = expert_mesh(build_mesh(ParallelDims(data=4)), ep=2)
    assert dist.get_process_group_ranks(mesh["ep"].get_group()) == [2, 3]
    assert dist.get_process_group_ranks(mesh["edp"].get_group()) == [1, 3]
    stage = build_stage(MIXTRAL, (0, 4), first_stage=True, last_stage=True)
    apply_expert_parallel(stage, mesh)
    names = {n for n, _ in stage.named_parameters() if ".experts." in n}
    assert {n.split(".experts.")[1].split(".")[0] for n in names} == {"2", "3"}
    assert "layers.0.mlp.router.weight" in dict(stage.named_parameters())


def test_mixtral_dp4_ep2_allgather_trains_as_one_process() -> None:
    # ep2 inside dp4: expert gradients also summed over the expert-data-parallel axis.
    check = _train(MIXTRAL, _spec(dp=4, expert=2, expert_dispatcher="allgather", micro_batches=2))
    for kinds in check.collectives:
        # Tokens and weights gathered, outputs reduce-scattered (and the mirror in
        # backward), per MoE layer and micro-batch.
        assert kinds["all_gather"]["count"] == kinds["reduce_scatter"]["count"] > 0
        assert "all_to_all" not in kinds


def test_mixtral_pp2_tp2_sequence_parallel_trains_as_one_process() -> None:
    # Every expert split as a dense MLP is, the router replicated; no expert parallelism.
    _train(MIXTRAL, _spec(pp=2, tp=2, sequence_parallel=True, micro_batches=2))


def _fail_on_the_first_attempt(rank: int, world_size: int) -> tuple[int, float]:
    import os

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and rank == 1:
        raise RuntimeError("the first attempt fails")
    x = torch.ones(1) * (rank + 1)
    dist.all_reduce(x)
    return attempt, float(x)


def test_a_restarted_attempt_meets_in_a_fresh_store_namespace() -> None:
    from runtime.elastic import launch

    # Trap 2: the restarted ranks must not read the failed attempt's peer addresses.
    results = launch(_fail_on_the_first_attempt, 2, max_restarts=1, collective_timeout_s=20)
    assert results == [(1, 3.0), (1, 3.0)]


def test_mixtral_tp2_dp2_ep2_alltoall_sequence_parallel_trains_as_one_process() -> None:
    # Experts tensor-parallel inside their expert-parallel ranks (Megatron's expert tensor
    # parallelism equal to tp); each rank's expert gradients reduced shard by shard.
    check = _train(MIXTRAL, _spec(
        dp=2, tp=2, expert=2, expert_dispatcher="alltoall", sequence_parallel=True,
        micro_batches=2,
    ))
    for kinds in check.collectives:
        # Counts, tokens and outputs exchanged forward, gradients back: 5 per MoE layer
        # and micro-batch (4 layers x 2 micro-batches x 2 steps).
        assert kinds["all_to_all"]["count"] == 5 * 4 * 2 * 2


def _point_to_point_and_a_subgroup(rank: int, world_size: int):
    from runtime.comm_counter import CommCounter

    pair = dist.new_group([0, 1])
    x = torch.ones(8)
    with CommCounter() as counter:
        if rank == 0:
            dist.send(x, 1, group=pair)
        else:
            dist.recv(x, 0, group=pair)
        dist.all_reduce(x, group=pair)
    return counter.by_kind(), counter.by_group()


def test_eager_sends_receives_and_all_reduces_are_counted_with_their_group() -> None:
    from runtime.elastic import launch

    (kinds0, groups0), (kinds1, _) = launch(_point_to_point_and_a_subgroup, 2)
    assert kinds0 == {"all_reduce": {"count": 1, "bytes": 32}, "send": {"count": 1, "bytes": 32}}
    assert kinds1 == {"all_reduce": {"count": 1, "bytes": 32}, "recv": {"count": 1, "bytes": 32}}
    assert [g["ranks"] for g in groups0] == [[0, 1], [0, 1]]


def test_cp2_pp2_llama_interleaved_full_recompute_trains_as_one_process() -> None:
    # Context parallelism: keys and values all-gathered over the context group (ranks
    # [0, 1] for rank 0), gradients averaged over data x context ranks.
    check = _train(LLAMA, _spec(
        cp=2, pp=2, virtual=2, schedule="interleaved", recompute="full",
    ))
    groups = {(g["kind"], tuple(g["ranks"])) for g in check.collectives_by_group[0]}
    assert ("all_gather", (0, 1)) in groups and ("all_reduce", (0, 1)) in groups
