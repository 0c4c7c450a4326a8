"""What every rank of a launched graph-plan job runs (`plan MODEL --gpus N --emit pytorch
DIR` writes the script that calls it; torchrun, Slurm or Ray start that script): the model
the plan names, built by the factory the user named (a zoo or hf: model at the plan's
shape, with each module's own initialisation), trained by Tessel's staged runtime
with the plan's stages, meshes and shardings, on batches shaped like the factory's example
inputs grown to the plan's global batch (random values, as `plan check` trains; feed real
data through `planner.parallelize` in your own loop). With `--checkpoint-dir`, a job
resumes from the latest checkpoint there and saves one every `--checkpoint-every` steps.
With `--elastic MIN:MAX` (torchrun `--nnodes` given as a range restarts the job with the
nodes present), a job that finds another number of ranks within MIN:MAX re-plans for
them (rank 0 plans, every rank runs the plan it sends) and resumes from the latest
checkpoint, which loads onto the new plan's shardings.

    torchrun --nproc-per-node 8 train_graph.py --steps 100 --checkpoint-dir ckpt/
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Sequence

import torch
import torch.distributed as dist

from planner.checks.operator import grown, synthetic_batches
from planner.models.sources import load_model, with_weights
from planner.vocabulary.plan import Plan
from runtime.checkpoint import latest_checkpoint
from runtime.graph_pipeline import StagedTrainer


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train_graph.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="the graph plan's JSON file")
    parser.add_argument("--model", required=True,
                        help="the model as the plan was made for it (file.py:function, "
                        "package.module:function, a zoo name or hf:config.json)")
    parser.add_argument("--shape", type=json.loads, default={},
                        help="a zoo or hf: model's shape as JSON config fields "
                        "('{\"num_layers\": 48}'), as the plan was made for it")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to run")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="resume from the latest checkpoint here and save into it")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="steps between checkpoints (with --checkpoint-dir)")
    parser.add_argument("--elastic", type=_rank_range, default=None, metavar="MIN:MAX",
                        help="on another number of ranks within MIN:MAX, re-plan for them "
                        "and resume from the latest checkpoint")
    parser.add_argument("--cluster", default=None,
                        help="the cluster to re-plan on (a preset or a cluster file; "
                        "default: the plan's, by name)")
    return parser.parse_args(list(argv))


def _rank_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    pair = int(low), int(high)
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text}: give MIN:MAX with 1 <= MIN <= MAX")
    return pair


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    plan = Plan.from_json(args.plan)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        world = dist.get_world_size()
        elastic = args.elastic is not None and args.elastic[0] <= world <= args.elastic[1]
        if world != plan.num_gpus and not elastic:
            raise SystemExit(f"the plan runs on {plan.num_gpus} ranks, this job has "
                             f"{world}; launch it with that many")
        loaded = load_model(args.model, args.shape)
        # A zoo or hf: model is built on the meta device to plan; here it trains.
        loaded = with_weights(loaded) or loaded
        device = "cuda" if cuda else "cpu"
        if world != plan.num_gpus:
            plan = _replanned(plan, loaded, world, args.cluster or plan.cluster, device)
        trainer = StagedTrainer(plan, loaded.model, loaded.example_inputs, loaded.loss_fn,
                                device_type=device)
        if args.checkpoint_dir and latest_checkpoint(args.checkpoint_dir) is not None:
            trainer.load(args.checkpoint_dir)
        examples = tuple(grown(x, plan.global_batch_size) for x in loaded.example_inputs)
        while trainer.steps_done < args.steps:
            (batch,) = synthetic_batches(examples, 1, seed=trainer.steps_done)
            batch = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch)
            loss = trainer.step(*batch)
            if loss is not None and trainer.local_rank == 0:
                print(f"step {trainer.steps_done} loss {loss:.6f}", flush=True)
            if args.checkpoint_dir and trainer.steps_done % args.checkpoint_every == 0:
                trainer.save(args.checkpoint_dir)
        dist.barrier()  # a rank leaving early can abort its peers' last collectives
    finally:
        dist.destroy_process_group()
    return 0


def _replanned(plan: Plan, loaded, world: int, cluster: str, device: str) -> Plan:
    """`plan` made again for `world` ranks of `cluster`: its global and micro-batch and
    precision kept, the rest searched; made on rank 0 and run by every rank."""
    from planner.api import plan_graph, plan_on_rank_0
    from planner.search.graph_knobs import GraphKnobs

    if dist.get_rank() == 0:
        print(f"{world} ranks, not the plan's {plan.num_gpus}: re-planning for them "
              "(--elastic)", flush=True)
    return plan_on_rank_0(
        lambda: plan_graph(loaded.model, loaded.example_inputs, world, cluster,
                           plan.global_batch_size, loaded.loss_fn, plan.micro_batch_size,
                           name=plan.model, knobs=GraphKnobs(precision=plan.precision)),
        device)
