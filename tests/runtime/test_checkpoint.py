"""Sharded checkpoints of the training-plan runtime (`runtime.checkpoint`) and what a rank
says when it loses a peer (`runtime.faults`): a 4-layer GPT (hidden 64, seq 16, global
batch 8) trained 4 steps, checkpointed, trained 4 more; a fresh trainer resumed from the
checkpoint repeats the last 4 bit for bit, on the same plan or (within rounding) on
another one."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from planner.models.config import TransformerConfig
from runtime.checkpoint import MARKER, cut_short, latest_checkpoint, step_directory
from runtime.elastic import launch
from runtime.faults import FaultWatch, PeerLost
from runtime.local_ranks import RankError, run_on_ranks
from planner.vocabulary.parallel_dims import ParallelDims
from runtime.resilience import Resilience
from runtime.spec import RunSpec, even_chunks
from runtime.pipeline_trainer import PipelineTrainer
from planner.checks.training_check import check_training, merge_results
from runtime.training_loop import batches

GPT = TransformerConfig(
    num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=16,
)
STEPS, SAVED_AT = 8, 4


def _spec(pp=1, dp=1, tp=1, micro_batches=4, **knobs) -> RunSpec:
    return RunSpec(degrees=ParallelDims(pipeline=pp, data=dp, tensor=tp), chunks=even_chunks(4, pp),
                   micro_batch_size=1, num_micro_batches=micro_batches, **knobs)


PP2_TP2_DP2 = _spec(pp=2, dp=2, tp=2, schedule="1f1b", zero_stage=1)  # global batch 8
DP8_ZERO3 = _spec(dp=8, micro_batches=1, schedule="gpipe", zero_stage=3)
DP4_ZERO3 = _spec(dp=4, micro_batches=2, schedule="gpipe", zero_stage=3)
# ZBV's V order puts both copies of the tied embedding on pipeline rank 0.
PP2_DP2_ZBV = RunSpec(degrees=ParallelDims(pipeline=2, data=2), chunks=even_chunks(4, 4),
                      micro_batch_size=1, num_micro_batches=4, virtual_pipeline=2,
                      schedule="zbv", zero_stage=1)


def _local_shards(trainer: PipelineTrainer) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() if hasattr(p, "to_local") else p.detach().clone()
            for p in trainer.parameters]


def _save_and_resume(rank: int, world: int, root: str, spec: RunSpec, other: RunSpec | None,
                     asynchronous: bool):
    """Train 8 steps saving after 4; a fresh trainer (other initial values) loads the
    checkpoint and trains the last 4 again; with `other`, so does a trainer of another
    plan. Returns the losses of each and whether the resumed run's shards are bit-equal."""
    data = batches(GPT, spec, STEPS)
    first = PipelineTrainer(GPT, spec, optimizer="adamw")
    losses = []
    for index in range(STEPS):
        losses.append(first.step(*data[index]))
        if first.steps_done == SAVED_AT:
            first.save(root, asynchronous=asynchronous)  # training goes on while it writes
    first.wait_for_checkpoint()
    # Same plan, same process groups (a new mesh costs seconds on 8 ranks), other values.
    resumed = PipelineTrainer(GPT, spec, seed=7, optimizer="adamw", mesh=first.mesh)
    at = resumed.load(root).step
    again = [resumed.step(*data[index]) for index in range(at, STEPS)]
    same_shards = all(torch.equal(a, b) for a, b in
                      zip(_local_shards(first), _local_shards(resumed), strict=True))
    moved = []
    if other is not None:
        elsewhere = PipelineTrainer(GPT, other, seed=7, optimizer="adamw")
        moved_at = elsewhere.load(root).step
        moved = [elsewhere.step(*data[index]) for index in range(moved_at, STEPS)]
    return {"losses": losses[SAVED_AT:], "resumed": again, "resumed_at": at,
            "same_shards": same_shards, "other": moved}


def _mean_over_last_stage(results: list[dict], key: str) -> list[float]:
    return merge_results([{"losses": r[key], "parameters": {}} for r in results])[0]


@pytest.mark.timeout(240)
def test_pp2_tp2_dp2_resumes_bit_for_bit_and_reshards_onto_dp8_zero3(tmp_path) -> None:
    results = launch(_save_and_resume, 8, str(tmp_path), PP2_TP2_DP2, DP8_ZERO3, True)
    assert latest_checkpoint(tmp_path) == step_directory(tmp_path, SAVED_AT)
    for r in results:
        assert r["resumed_at"] == SAVED_AT
        assert r["resumed"] == r["losses"]  # bit-identical, on the last stage's ranks
        assert r["same_shards"], "a resumed rank's parameters differ from the uninterrupted run's"
    losses = _mean_over_last_stage(results, "losses")
    assert len(losses) == STEPS - SAVED_AT and losses[0] is not None
    # Another plan sums in another order: equal to fp32 rounding.
    moved = _mean_over_last_stage(results, "other")
    torch.testing.assert_close(torch.tensor(moved), torch.tensor(losses), rtol=1e-5, atol=0)


@pytest.mark.timeout(120)
def test_dp4_zero3_resumes_bit_for_bit_and_reshards_onto_two_embedding_copies(tmp_path) -> None:
    results = launch(_save_and_resume, 4, str(tmp_path), DP4_ZERO3, PP2_DP2_ZBV, False)
    marker = json.loads((step_directory(tmp_path, SAVED_AT) / MARKER).read_text())
    assert marker["step"] == SAVED_AT and marker["world_size"] == 4
    for r in results:
        assert r["resumed"] == r["losses"] and r["same_shards"]
    # Each copy of the embedding gets its own AdamW moments (one shared tensor would be
    # updated twice a step, 5e-5 off by the second step).
    torch.testing.assert_close(torch.tensor(_mean_over_last_stage(results, "other")),
                               torch.tensor(_mean_over_last_stage(results, "losses")),
                               rtol=1e-5, atol=0)


# ----- without processes -------------------------------------------------------------


def test_latest_checkpoint_skips_a_save_cut_short(tmp_path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    for step, complete in ((2, True), (4, True), (6, False)):  # step 6: no marker
        folder = step_directory(tmp_path, step)
        folder.mkdir()
        if complete:
            (folder / MARKER).write_text(json.dumps({"step": step, "world_size": 2}))
    assert latest_checkpoint(tmp_path) == step_directory(tmp_path, 4)
    assert cut_short(tmp_path) == [step_directory(tmp_path, 6)]


def test_a_save_whole_on_disk_is_marked_though_a_peer_dies_before_dcp_answers(
        tmp_path, monkeypatch) -> None:
    """DCP's coordinator writes ``.metadata`` once every rank's part is on disk, then sends
    the outcome to every rank; a peer that has just died fails that send, and the save
    raises. The checkpoint is whole: it is marked, and a restarted job resumes from it."""
    from torch import nn
    from torch.distributed.checkpoint.utils import _DistWrapper

    from runtime.checkpoint import ModulesState, save

    def peer_gone(self, obj):
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1")

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        model = nn.Linear(4, 2)
        state = ModulesState({0: model}, torch.optim.AdamW(model.parameters()))
        monkeypatch.setattr(_DistWrapper, "broadcast_object", peer_gone)
        with pytest.raises(RuntimeError, match="Connection closed by peer"):
            save(state, tmp_path / "ck", step=2)
    finally:
        dist.destroy_process_group()
    assert (step_directory(tmp_path / "ck", 2) / ".metadata").is_file()
    assert latest_checkpoint(tmp_path / "ck") == step_directory(tmp_path / "ck", 2)
    assert cut_short(tmp_path / "ck") == []


def _watch(peers: dict[int, int], root=None) -> FaultWatch:
    """Rank 0's FaultWatch over local processes `peers` (rank -> pid)."""
    last = Resilience(str(root)).last_checkpoint if root is not None else None
    watch = FaultWatch(0, {rank: (1, pid) for rank, pid in peers.items()}, last)
    watch.look_s = 0.0
    return watch


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[-1].split()[0]


def test_a_rank_names_the_peer_whose_process_is_gone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("runtime.faults.collective_timeout", lambda: timedelta(seconds=30))
    child = subprocess.Popen(["true"])  # exits and stays a zombie: never waited for here
    alive = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _process_state(child.pid) != "Z":
            time.sleep(0.01)
        folder = step_directory(tmp_path, 4)
        folder.mkdir()
        (folder / MARKER).write_text(json.dumps({"step": 4, "world_size": 3}))
        watch = _watch({0: 1, 1: child.pid, 2: alive.pid}, tmp_path)
        lost = watch.explain(RuntimeError("Connection closed by peer [127.0.0.1]:1"), 5)
        assert isinstance(lost, PeerLost) and lost.lost == [1]
        assert str(lost) == (f"rank 0 lost rank 1 (process {child.pid} is gone) in step 5; "
                             f"last good checkpoint: {folder}")
        # Every peer alive and a collective timed out: a peer hangs.
        hung = _watch({0: 1, 2: alive.pid}).explain(
            RuntimeError("Timed out waiting 30000ms for recv operation to complete"), 2)
        assert str(hung) == ("rank 0: a peer did not answer within 30 s (every peer's "
                             "process is alive: one hangs) in step 2; last good checkpoint: "
                             "none (not checkpointing)")
        # Anything else is no fault of a peer: raised as it is.
        bug = ValueError("shapes differ")
        assert _watch({0: 1, 2: alive.pid}).explain(bug, 0) is bug
    finally:
        alive.kill()
        alive.wait()
        child.wait()


def test_a_closed_connection_with_every_peer_alive_is_read_in_the_flight_records(
        tmp_path, monkeypatch) -> None:
    """A peer's own timeout closes its connections: this rank sees a closed connection,
    not a timeout, while every process is alive; the flight records name the rank that
    hangs."""
    from runtime.flight_recorder import FLIGHT_DIR_ENV

    tp = [0, 1, 2]
    for rank, seqs in ((0, (1, 2)), (1, (1, 2)), (2, (1,))):
        (tmp_path / f"rank{rank}.attempt0.jsonl").write_text("".join(
            json.dumps({"group": "0", "ranks": tp, "seq": seq, "kind": "all_reduce",
                        "step": seq}) + "\n" for seq in seqs))
    monkeypatch.setenv(FLIGHT_DIR_ENV, str(tmp_path))
    alive = subprocess.Popen(["sleep", "30"])
    try:
        seen = _watch({0: 1, 1: alive.pid, 2: alive.pid}).explain(
            RuntimeError("Connection closed by peer [127.0.0.1]:1"), 2)
    finally:
        alive.kill()
        alive.wait()
    assert isinstance(seen, PeerLost) and seen.hung == [2] and seen.step == 2
    assert str(seen) == ("rank 0 lost its connection to a peer: rank 2 never entered "
                         "all_reduce #2 on ranks 0-2 (step 2), in which ranks 0, 1 waited; "
                         "last good checkpoint: none (not checkpointing)")


@pytest.mark.timeout(120)
def test_a_killed_rank_is_named_with_the_last_good_checkpoint(tmp_path) -> None:
    """No restart left: the job fails fast, naming the killed rank and the checkpoint it
    can resume from."""
    spec = _spec(pp=2, micro_batches=2, schedule="1f1b")
    resilience = Resilience(str(tmp_path), every=1, kill_rank=1, kill_at_step=3,
                            asynchronous=False)
    start = time.monotonic()
    with pytest.raises(RankError) as failure:
        check_training(GPT, spec, 4, resilience=resilience)
    assert time.monotonic() - start < 60
    message = str(failure.value)
    # As the agent saw it (the signal) or, when it saw a peer fail first, as the peer did.
    assert failure.value.rank == 1 and message.startswith("rank 1 failed"), message
    assert "Signal 9 (SIGKILL)" in message or "lost rank 1 (process" in message, message
    assert message.endswith(f"; last good checkpoint: {step_directory(tmp_path, 3)}")


def test_a_rank_only_its_peers_saw_die_is_the_one_named(tmp_path) -> None:
    """The agent saw only rank 0 fail (it raised PeerLost); the killed rank 1 is named."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime.elastic import _root_cause

    (tmp_path / "store.errors").mkdir()
    seen = "rank 0 lost rank 1 (process 42 is gone) in step 3; last good checkpoint: X"
    (tmp_path / "store.errors" / "rank0.attempt0.json").write_text(json.dumps({
        "rank": 0, "attempt": 0, "summary": f"PeerLost: {seen}", "traceback": "",
        "time_ns": 1, "lost": [1]}))
    failure = ProcessFailure(local_rank=0, pid=41, exitcode=1, error_file="")
    error = _root_cause(ChildFailedError("fn", {0: failure}), tmp_path)
    assert error.rank == 1 and str(error) == f"rank 1 failed without a word; {seen}"


def test_a_killed_rank_is_named_with_the_step_its_peer_lost_it_in(tmp_path) -> None:
    """The agent saw rank 1 killed; rank 0 said in which step it lost it. The checkpoint
    is the one on disk once every rank stopped, not the one rank 0 saw (a save was still
    being written then)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime.elastic import _report, _root_cause

    try:
        raise PeerLost("rank 0 lost rank 1 (process 42 is gone) in step 3; last good "
                       "checkpoint: none yet", [1], step=3)
    except PeerLost as error:
        _report(tmp_path / "store.errors", 0, 0, error)
    folder = step_directory(tmp_path / "ck", 2)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"step": 2, "world_size": 2}))
    killed = ProcessFailure(local_rank=1, pid=42, exitcode=-9, error_file="")
    error = _root_cause(ChildFailedError("fn", {1: killed}), tmp_path, tmp_path / "ck")
    assert error.rank == 1 and str(error) == (
        f"rank 1 failed in step 3: Signal 9 (SIGKILL) received by PID 42; last good "
        f"checkpoint: {folder}")


def test_a_step_stopped_on_divergence_is_named_as_such(tmp_path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime.divergence import Diverged
    from runtime.elastic import _ranks_output, _report, _root_cause

    for rank in (0, 1):
        try:
            raise Diverged("step 2: loss nan is not finite on rank 1 (rank 0 too); stopped "
                           "(--on-divergence stop); last good checkpoint: none yet")
        except Diverged as error:
            _report(tmp_path / "store.errors", rank, 0, error)
    failures = {r: ProcessFailure(local_rank=r, pid=40 + r, exitcode=1, error_file="")
                for r in (0, 1)}
    error = _root_cause(ChildFailedError("fn", failures), tmp_path)
    assert str(error) == ("step 2: loss nan is not finite on rank 1 (rank 0 too); stopped "
                          "(--on-divergence stop); last good checkpoint: none yet")
    # What each rank printed, then what it raised, attempt by attempt.
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "rank1.attempt0.log").write_text("E schedule caught it\n")
    said = _ranks_output(tmp_path)
    assert said.index("== attempt 0, rank 0: raised ==") < said.index(
        "== attempt 0, rank 1: printed ==\nE schedule caught it\n") < said.index(
        "== attempt 0, rank 1: raised ==\nTraceback (most recent call last):")
    assert said.count("Diverged: step 2") == 2


def test_a_half_written_report_is_read_as_a_rank_without_a_word(tmp_path) -> None:
    """A report cut short (the agent stopped its rank mid-write after a peer failed, or the
    disk filled) does not hide the root cause: the whole reports name it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from runtime.elastic import _report, _root_cause

    folder = tmp_path / "store.errors"
    try:
        raise ValueError("bad batch")
    except ValueError as error:
        _report(folder, 0, 0, error)
    assert [p.name for p in folder.iterdir()] == ["rank0.attempt0.json"]  # nothing partial
    (folder / "rank1.attempt0.json").write_text('{"rank": 1, "summ')
    failures = {r: ProcessFailure(local_rank=r, pid=40 + r, exitcode=1, error_file="")
                for r in (0, 1)}
    error = _root_cause(ChildFailedError("fn", failures), tmp_path)
    assert error.rank == 0 and str(error) == "rank 0 failed: ValueError: bad batch"


def _loss_scale_round_trip(rank: int, world: int, root: str) -> list[tuple[float, int]]:
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.device_mesh import init_device_mesh

    from runtime.checkpoint import ShardsState, load, save
    from runtime.loss_scale import INITIAL_SCALE, LossScale

    mesh = init_device_mesh("cpu", (world,))

    def state(scale: LossScale | None) -> ShardsState:
        local = torch.full((2,), float(rank))
        layout = DTensor.from_local(local, mesh, (Shard(0),), run_check=False)
        optimizer = torch.optim.AdamW([local])
        return ShardsState({"w": layout}, {"w": local}, optimizer, loss_scale=scale)

    save(state(LossScale(scale=1024.0, good_steps=7)), root, step=1)
    save(state(None), root + "-bf16", step=1)  # a plan without loss scaling
    resumed, fresh = LossScale(), LossScale()
    load(state(resumed), root)
    load(state(fresh), root + "-bf16")
    assert (fresh.scale, fresh.good_steps) == (INITIAL_SCALE, 0)
    return [(resumed.scale, resumed.good_steps), (fresh.scale, fresh.good_steps)]


def test_an_fp16_trainers_loss_scale_resumes_where_it_was(tmp_path) -> None:
    """The loss scale is part of the checkpoint: a resumed fp16 run scales its next step as
    the uninterrupted one would (not from 2**16 again); a checkpoint of a plan without
    loss scaling loads onto an fp16 one, which starts from the initial scale."""
    results = run_on_ranks(_loss_scale_round_trip, 2, str(tmp_path / "ckpt"))
    assert results == [[(1024.0, 7), (2.0**16, 0)]] * 2
