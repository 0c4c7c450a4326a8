"""Exposed communication at a million GPUs as the scale-up bandwidth grows, beside HotNets
2024's estimate (issue 47): a dense and a mixture-of-experts model on 2^20 GPUs of GB200
NVL72 racks (72 GPUs per NVLink domain), the scale-up link per GPU swept from 0.8 Tb/s to
14.4 Tb/s (both directions; NVLink 5 is 14.4), each point planned anew (the search picks
the layout that link favours), and its exposed communication printed: the step less the
same plan's step with every link unbounded (`cost_models.bandwidth_sweep.UNBOUNDED_GBS`),
over the step.

The paper's figures, as issue 47 quotes them: exposed communication 40% (dense) and 75%
(MoE) at 0.8 Tb/s of scale-up bandwidth, falling to 5% and 20% at 14.4 Tb/s. Its models,
batches and scale-out network are not restated here, so the comparison is of shape (falls
as bandwidth grows; MoE above dense), not of values. Where Tessel's exposed share is below
the paper's at a slow link, it is the search's doing: it moves tensor and context
parallelism off a slow scale-up link (and experts onto it as it gets faster), where a
fixed layout would wait on it; each point prints the layout chosen.

    .venv/bin/python benchmarks/network_sweep.py [--gpus N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.bandwidth_sweep import UNBOUNDED_GBS  # noqa: E402
from cost_models.step_time import predict_stages  # noqa: E402
from planner.export.plan_config import parallel_config, stage_layouts  # noqa: E402
from planner.models.config import TransformerConfig  # noqa: E402
from planner.models.presets import get_preset  # noqa: E402
from planner.plans.transformer_plan import ranked_plans  # noqa: E402
from planner.search import search  # noqa: E402
from planner.vocabulary.cluster import Cluster  # noqa: E402
from planner.vocabulary.parallel import FixedKnobs  # noqa: E402

SCALE_UP_TBPS = (0.8, 1.6, 3.2, 7.2, 14.4)
"""Scale-up bandwidth per GPU, both directions, in Tb/s (14.4 = NVLink 5's 1.8 TB/s)."""
PAPER = {"dense": (0.40, 0.05), "moe": (0.75, 0.20)}
"""HotNets 2024's exposed communication at 0.8 and at 14.4 Tb/s, as issue 47 quotes it."""
# (kind, preset, sequence length, sequences per GPU)
MODELS = (("dense", "llama3-405b", 8192, 1), ("moe", "deepseek-v3", 4096, 4))


def exposed_share(name: str, model: TransformerConfig, cluster: Cluster,
                  gbs: int) -> tuple[float, float, str]:
    """(step s, exposed share, layout) of the best plan of `model` on `cluster`."""
    found = search(model, cluster, gbs, FixedKnobs(), space="megatron")
    if not found.ranked:
        raise RuntimeError(f"nothing fits on {cluster.num_devices} GPUs")
    plan = ranked_plans(name, model, cluster, found, 1)[0]
    parallel, stages = parallel_config(plan), stage_layouts(plan)
    unbounded = cluster.model_copy(update={
        tier: getattr(cluster, tier).model_copy(update={"bandwidth_gbs": UNBOUNDED_GBS})
        for tier in ("intra_node", "inter_node")})
    step = plan.predicted.step_time_s
    free = predict_stages(model, unbounded, parallel, stages).step_time_s
    q = plan.parallel
    assert q is not None
    layout = f"t{q.tensor} p{len(plan.stages)} c{q.context} e{q.expert} d{q.data}"
    return step, (step - free) / step, layout


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1 << 20)
    parser.add_argument("--json", type=Path, help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    base = Cluster.load("gb200-nvl72").with_devices(args.gpus)
    rows = []
    print(f"{'model':<12} {'scale-up Tb/s':>13} {'layout':<24} {'step s':>8} "
          f"{'exposed':>8}  paper")
    for kind, preset, seq, per_gpu in MODELS:
        model = get_preset(preset).model_copy(update={"seq_length": seq})
        for tbps in SCALE_UP_TBPS:
            link = base.intra_node.model_copy(update={"bandwidth_gbs": tbps * 1000 / 8 / 2})
            cluster = base.model_copy(update={"intra_node": link})
            start = time.perf_counter()
            step, share, layout = exposed_share(preset, model, cluster, per_gpu * args.gpus)
            paper = {SCALE_UP_TBPS[0]: PAPER[kind][0], SCALE_UP_TBPS[-1]: PAPER[kind][1]}
            said = f"{paper[tbps]:.0%}" if tbps in paper else ""
            print(f"{preset:<12} {tbps:>13g} {layout:<24} {step:>8.2f} {share:>8.1%}  {said}",
                  flush=True)
            rows.append({"kind": kind, "model": preset, "scale_up_tbps": tbps,
                         "layout": layout, "step_s": step, "exposed_share": share,
                         "paper_share": paper.get(tbps),
                         "plan_s": time.perf_counter() - start})
    def of(kind: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["kind"] == kind]

    # Each point is planned anew, so the search may buy a faster step with more of it
    # exposed (a wider expert group over a faster link): the step falls at every point,
    # and the exposed share from the slowest link to the fastest.
    faster = all(of(k, "step_s") == sorted(of(k, "step_s"), reverse=True) for k in PAPER)
    falls = all(of(k, "exposed_share")[-1] < of(k, "exposed_share")[0] for k in PAPER)
    moe_above = all(m >= d for d, m in zip(of("dense", "exposed_share"),
                                           of("moe", "exposed_share")))
    print(f"\nthe step falls at every bandwidth: {'yes' if faster else 'NO'}; exposed "
          f"communication falls from 0.8 to 14.4 Tb/s: {'yes' if falls else 'NO'}; the MoE "
          f"model above the dense one at every point: {'yes' if moe_above else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if faster and falls else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
