"""Per-step overhead of Tessel's training runtime against the same parallelism written by
hand with torch's APIs, side by side on the same ranks.

Each case trains the zoo's 4-layer Llama (hidden 64, 4 heads / 2 key-value groups, seq 16,
vocabulary 256, untied) on 4 local gloo ranks started by `runtime.elastic.launch`. Every
rank builds two copies of the same model from the same initial values:

- runtime: `runtime.pipeline_trainer.PipelineTrainer` fed a `RunSpec`; its `step` is timed
  directly (its wrappers and hooks, the pipeline schedule it always runs, its
  byte bookkeeping ``held``; `train_on_rank`'s collective counting is not included);
- hand-written: `runtime.stages.build_stage` as the model definition only, parallelized
  and trained by hand: `parallelize_module` with ColwiseParallel / RowwiseParallel (the
  same Megatron layout: q/k/v and gate/up column-, o/down row-parallel, vocabulary-
  parallel embedding and head, each block's attention and MLP input one replicated
  DTensor), `fully_shard` per block and at the root, `PipelineStage` + `Schedule1F1B`
  under pipelining, otherwise a plain micro-batch loop (gradient sync on the last
  micro-batch only, as the schedule does), then the optimizer step.

Both get the same optimizer (AdamW, foreach=False, or SGD), the same batches, micro-
batching (4 micro-batches of 2 sequences per data-parallel rank), warm-up steps and
timing: barrier, `time.perf_counter()` around one step, barrier, with the two steps of a
round run in alternating order (runtime first on even rounds, hand-written first on odd
ones) so that noise of a shared machine hits both alike. A step's time is the slowest
rank's; the table gives each side's median over the timed steps, the ratio runtime /
hand-written of those medians (target <= 1.15), the median of the per-round ratios
(``paired``: the two steps of a round ran back to back, so slow drifts of the machine
cancel) and the largest relative difference of the two sides' losses, step by step (they
run the same math from the same values: about 0).

Cases (4 ranks each): tp2.dp2 and pp2.dp2 with ZeRO-2 (`fully_shard`, parameters kept
gathered from forward to backward), dp4 with ZeRO-3.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 30] [--warmup 3]
        [--optimizer adamw|sgd] [--case tp2.dp2 ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B  # noqa: E402
from torch.distributed.tensor import Replicate  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from planner.models.config import TransformerConfig  # noqa: E402
from runtime.elastic import launch  # noqa: E402
from planner.vocabulary.parallel_dims import ParallelDims  # noqa: E402
from runtime.spec import RunSpec, even_chunks  # noqa: E402
from runtime.stages import build_stage, materialize  # noqa: E402
from runtime.pipeline_trainer import OPTIMIZERS, PipelineTrainer, lm_loss  # noqa: E402
from runtime.training_loop import batches  # noqa: E402

LLAMA = TransformerConfig(
    num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2, vocab_size=256,
    seq_length=16, norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=False,
    tie_embeddings=False,
)
MICRO_BATCH_SIZE, MICRO_BATCHES = 2, 4
CASES = {  # name -> (degrees, ZeRO stage)
    "tp2.dp2": (ParallelDims(data=2, tensor=2), 2),
    "pp2.dp2": (ParallelDims(pipeline=2, data=2), 2),
    "dp4.zero3": (ParallelDims(data=4), 3),
}
TARGET = 1.15


def run_spec(degrees: ParallelDims, zero_stage: int) -> RunSpec:
    return RunSpec(
        degrees=degrees, chunks=even_chunks(LLAMA.num_layers, degrees.pp),
        micro_batch_size=MICRO_BATCH_SIZE, num_micro_batches=MICRO_BATCHES,
        schedule="1f1b", zero_stage=zero_stage,
    )


class HandWritten:
    """The same training written directly against torch's APIs: what one writes for this
    model without a runtime."""

    def __init__(
        self, config: TransformerConfig, degrees: ParallelDims, zero_stage: int, seed: int,
        optimizer: str,
    ) -> None:
        pp, dp, tp = degrees.pp, degrees.dp, degrees.tp
        mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        self.pp, self.dp = pp, dp
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.first, self.last = self.pp_rank == 0, self.pp_rank == pp - 1
        layers = even_chunks(config.num_layers, pp)[self.pp_rank]
        model = build_stage(config, layers, first_stage=self.first, last_stage=self.last)
        if tp > 1:
            tensor_parallel(model, mesh["tp"])
        if dp > 1:
            reshard = zero_stage == 3
            for block in model.layers.values():
                fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard)
        materialize(model, seed)
        self.model = model
        cls, kwargs = OPTIMIZERS[optimizer]
        self.optimizer = cls(model.parameters(), foreach=False, **kwargs)
        self.schedule = None
        if pp > 1:
            b, s, h = MICRO_BATCH_SIZE, config.seq_length, config.hidden_size
            hidden = torch.empty(b, s, h, device="meta", requires_grad=True)
            ids = torch.empty(b, s, dtype=torch.long, device="meta")
            logits = torch.empty(b, s, config.vocab_size, device="meta", requires_grad=True)
            stage = PipelineStage(
                model, self.pp_rank, pp, torch.device("cpu"),
                input_args=ids if self.first else hidden,
                output_args=logits if self.last else hidden,
                group=mesh["pp"].get_group(),
            )
            self.schedule = Schedule1F1B(stage, MICRO_BATCHES, loss_fn=lm_loss, scale_grads=True)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float | None:
        tokens, targets = tokens.chunk(self.dp)[self.dp_rank], targets.chunk(self.dp)[self.dp_rank]
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            if self.first:
                self.schedule.step(tokens)
            else:
                self.schedule.step(target=targets, losses=losses)
            loss = torch.stack([x.detach() for x in losses]).mean() if self.last else None
        else:
            fsdp = isinstance(self.model, FSDPModule)
            loss = 0.0
            for i, (x, y) in enumerate(zip(tokens.chunk(MICRO_BATCHES),
                                           targets.chunk(MICRO_BATCHES))):
                if fsdp:  # reduce-scatter once, after the last micro-batch
                    last = i == MICRO_BATCHES - 1
                    self.model.set_requires_gradient_sync(last)
                    self.model.set_reshard_after_backward(last)
                mb_loss = lm_loss(self.model(x), y) / MICRO_BATCHES
                mb_loss.backward()
                loss = loss + mb_loss.detach()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return None if loss is None else float(loss)


def tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """Megatron's layout with torch's parallel styles."""
    for block in model.layers.values():
        block.attn.local_heads(tp_mesh.size())  # the attention reshapes by local heads
        parallelize_module(block, tp_mesh, {
            "attn": PrepareModuleInput(
                input_layouts=(Replicate(), None), desired_input_layouts=(Replicate(), None)),
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(),
            "mlp": PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        })
    plan = {}
    if model.embed is not None:
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)


def _timed(step, tokens, targets) -> tuple[float, float | None]:
    dist.barrier()
    start = time.perf_counter()
    loss = step(tokens, targets)
    dist.barrier()
    return time.perf_counter() - start, loss


def _on_rank(
    rank: int, world: int, case: str, steps: int, warmup: int, seed: int, optimizer: str,
) -> dict:
    # Both sides' stage modules return views of FSDP outputs; the warning says nothing here.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    degrees, zero_stage = CASES[case]
    spec = run_spec(degrees, zero_stage)
    sides = {
        "runtime": PipelineTrainer(LLAMA, spec, seed, optimizer).step,
        "hand": HandWritten(LLAMA, degrees, zero_stage, seed, optimizer).step,
    }
    times = {name: [] for name in sides}
    losses = {name: [] for name in sides}
    for i, (tokens, targets) in enumerate(batches(LLAMA, spec, warmup + steps, seed)):
        order = ("runtime", "hand") if i % 2 == 0 else ("hand", "runtime")
        for name in order:
            seconds, loss = _timed(sides[name], tokens, targets)
            losses[name].append(loss)
            if i >= warmup:
                times[name].append(seconds)
    return {"times": times, "losses": losses}


def measure(case: str, steps: int, warmup: int, seed: int, optimizer: str) -> dict:
    degrees, _ = CASES[case]
    results = launch(_on_rank, degrees.world_size, case, steps, warmup, seed, optimizer)
    row: dict = {"case": case, "ranks": degrees.world_size, "steps": steps}
    slowest = {  # per timed step, the slowest rank's seconds
        name: [max(step) for step in zip(*(r["times"][name] for r in results))]
        for name in ("runtime", "hand")
    }
    for name, seconds in slowest.items():
        row[f"{name}_ms"] = 1e3 * statistics.median(seconds)
    row["ratio"] = row["runtime_ms"] / row["hand_ms"]
    # Each round's two steps, run back to back: robust to the machine's slow drifts.
    row["paired_ratio"] = statistics.median(
        a / b for a, b in zip(slowest["runtime"], slowest["hand"])
    )
    pairs = [
        (a, b) for r in results
        for a, b in zip(r["losses"]["runtime"], r["losses"]["hand"]) if a is not None
    ]
    row["loss_max_rel_diff"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw")
    parser.add_argument("--case", action="append", choices=list(CASES),
                        help="run only these cases (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'case':>10} {'runtime ms':>10} {'hand ms':>8} {'ratio':>6} {'paired':>6} "
          f"{'loss diff':>9}")
    for case in args.case or list(CASES):
        row = measure(case, args.steps, args.warmup, args.seed, args.optimizer)
        rows.append(row)
        flag = "" if row["ratio"] <= TARGET else f"  above {TARGET}"
        print(f"{case:>10} {row['runtime_ms']:>10.1f} {row['hand_ms']:>8.1f} "
              f"{row['ratio']:>6.2f} {row['paired_ratio']:>6.2f} "
              f"{row['loss_max_rel_diff']:>9.1e}{flag}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
