"""Tessel's intra-op ILP side by side with Meta's AutoParallel on models neither has seen.

For each model of a family drawn from a seed (`benchmarks/model_family.py`: GPT, Llama,
BERT, ViT, T5, MoE, MLP-mixer; 1-D and 2-D meshes of 4 and 8 devices), alternately:

1. AutoParallel plans it in a process of its own environment (its repository's
   `AutoParallel(...)`, the batch pinned to mesh axis 0 on input and output, parameters
   capped at 1/devices of their size as its examples do; PuLP's CBC, no time limit);
2. Tessel plans it in a fresh process of the project's environment under the same two
   constraints (like with like: the ratio compares these two), then unconstrained, then
   with AutoParallel's chosen parameter placements pinned, which prices AutoParallel's
   layout in Tessel's cost model: the best completion of it with identical blocks tied,
   as AutoParallel ties them (the yardstick for Tessel's tied plan), and untied (a lower
   bound on the step of any plan with those placements);
3. Tessel's own default plan, the one `plan model.py:factory --mesh M` gives a user
   (`planner.api.plan_model`: unconstrained, untied, the default time limit), in a fresh
   process of its own: its wall time from the process's start and its solver status.

Each row prints the wall time of both processes (imports, trace, strategies, the ILP's
build and solve: what a user waits for), variables, solver status and gap, the ratio, and
the predicted step of Tessel's plan and of AutoParallel's placements; the summary gives
the median and worst of each. Both tools start alike: Python, `import torch`, DTensor and
AOTAutograd, then the same `aot_export_joint_with_descriptors` of the model and its loss.
Each side also records when that joint export returned, and the summary gives the ratio
of the time after it (each tool's own work: strategies, the ILP's build and solve; for
AutoParallel also nothing of its import, which comes before) beside the whole-process
ratio, so a row whose time is mostly that shared start shows as such.

Setting up the peer (once; never in the project's environment; see
../shared/notes/autoparallel-on-cpu.md for what was verified):

    # its tree: github:meta-pytorch/autoparallel (a54c252 verified), unpacked at
    # /work/ap/autoparallel (`git archive` of a clone)
    python3 -m venv /work/ap/venv
    /work/ap/venv/bin/pip install torch==2.13.0          # the local CPU wheel, as the Makefile does
    /work/ap/venv/bin/pip install pulp filecheck numpy
    /work/ap/venv/bin/pip install --no-deps -e /work/ap/autoparallel

Run (about a minute per model):

    .venv/bin/python benchmarks/vs_autoparallel.py [--models 12] [--seed 0] \
        [--peer-python /work/ap/venv/bin/python] [--json rows.json]
"""

from __future__ import annotations

import time

# Each side's time runs from here (its process's first line, before torch is imported) to
# its plan under AutoParallel's constraints: the work after (Tessel's other two solves,
# printing) is not charged to either.
PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_family import ModelSpec, build, draw_family, spec_from_dict  # noqa: E402

PEER_PYTHON = "/work/ap/venv/bin/python"


def record_joint_export(module) -> list[float]:
    """Wrap `module.aot_export_joint_with_descriptors` (where a tool looks it up) so that
    each return appends the time since this process started to the list returned."""
    returned: list[float] = []
    export = module.aot_export_joint_with_descriptors

    def timed(*args, **kwargs):
        result = export(*args, **kwargs)
        returned.append(time.perf_counter() - PROCESS_START)
        return result

    module.aot_export_joint_with_descriptors = timed
    return returned


# --- AutoParallel's side: runs in its own environment -------------------------------------

def _patch_device_queries() -> None:
    """AutoParallel's compute-cost estimator asks the device's name and capability; answer
    as its own tests/conftest.py does (an H100), and give the CPU a name too."""
    import torch

    props = type("Props", (), {"major": 9, "minor": 0, "name": "H100",
                               "total_memory": 80 * 2**30, "multi_processor_count": 132})()
    torch.cuda.device_count = lambda: 8
    torch.cuda.get_device_name = lambda *a, **k: "H100"
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cpu.get_device_name = lambda *a, **k: "H100"


def _register_cpu_attention_rules() -> None:
    """On CPU, SDPA runs as `_scaled_dot_product_flash_attention_for_cpu`, for which
    AutoParallel has no rule (it would replicate it): register the three strategies
    DTensor has for the CUDA flash kernel (replicated, split by batch, split by heads)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy,
        register_op_strategy,
    )

    aten = torch.ops.aten

    def rule(outputs: int):
        def strategy(op_schema):
            tensors = sum(1 for a in op_schema.args_schema if hasattr(a, "strategies"))
            placements = [[p] * (outputs + tensors) for p in (Replicate(), Shard(0), Shard(1))]
            return expand_to_full_mesh_op_strategy(
                op_schema.get_mesh_from_args(), op_schema, placements, input_index=outputs)
        return strategy

    register_op_strategy(aten._scaled_dot_product_flash_attention_for_cpu.default)(rule(2))
    register_op_strategy(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default)(rule(3))


def run_autoparallel(spec: ModelSpec) -> dict:
    """Plan `spec` with AutoParallel; its ILP's size, status, time and parameter placements."""
    start = PROCESS_START
    import pulp
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _patch_device_queries()
    _register_cpu_attention_rules()
    import autoparallel.api
    from autoparallel.api import AutoParallel

    traced = record_joint_export(autoparallel.api)

    world = 1
    for size in spec.mesh:
        world *= size
    torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    mesh = init_device_mesh("cpu", spec.mesh)
    with torch.device("meta"):
        model, _ = build(spec, "meta")

    def input_fn():
        return torch.rand(spec.batch, spec.seq, spec.width)

    batch = (Shard(0),) + (Replicate(),) * (len(spec.mesh) - 1)
    with AutoParallel(model, input_fn, mesh) as autop:
        autop.add_parameter_memory_constraint(low=None, high=None)
        autop.add_input_constraints([batch])
        autop.add_output_constraints([batch])
        built = time.perf_counter()
        placement = autop.optimize_placement()
        solved = time.perf_counter()
        optimizer = autop.sharding_optimizer
        from autoparallel.graph_passes.graph_utils import get_param_nodes  # noqa: F401

        fqns = list(autop.joint_with_descriptors.params_spec)
        params = [n for n in autop.gm.graph.nodes if n.op == "placeholder"][:len(fqns)]
        placements = {fqn: [_placement_text(p) for p in placement[node].output_specs.placements]
                      for fqn, node in zip(fqns, params)}
        return {
            "variables": len(optimizer.prob.variables()),
            "status": pulp.LpStatus[optimizer.prob.status],
            "gap": 0.0 if optimizer.prob.status == 1 else None,
            "build_s": built - start, "solve_s": solved - built, "planned_s": solved - start,
            "traced_s": traced[0],
            "parameter_placements": placements,
        }


def _placement_text(p) -> str:
    """'R', 'S(d)' or 'P' (sum): the placement as both environments can read it."""
    if p.is_replicate():
        return "R"
    if p.is_shard():
        return f"S({p.dim})"
    return "P"


# --- the driver ---------------------------------------------------------------------------

def side(python: str, which: str, spec: ModelSpec, extra: dict | None = None) -> dict:
    """Run one side in a fresh process; its JSON answer with the process's wall time."""
    payload = json.dumps({"spec": spec.as_dict(), **(extra or {})})
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, __file__, "--side", which, "--payload", payload],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"error": " | ".join(tail), "wall_s": seconds}
    return {**json.loads(lines[-1]), "wall_s": seconds}


def compare(spec: ModelSpec, peer_python: str) -> dict:
    peer = side(peer_python, "autoparallel", spec)
    ours = side(sys.executable, "tessel", spec,
                {"pinned": peer.get("parameter_placements")})
    default = side(sys.executable, "default", spec)
    return {"model": spec.name, "autoparallel": peer, "tessel": ours, "default": default}


def run_default(spec: ModelSpec) -> dict:
    """Tessel's default plan of `spec` (`plan_model` as `plan --mesh` calls it): the time
    from this process's start to the plan, and the ILP's size, status and gap."""
    from model_family import build

    from planner.api import plan_model

    model, example = build(spec)
    planned = plan_model(model, (example,), spec.mesh, "cpu")
    solver = planned.plan.operators.solver
    return {"planned_s": time.perf_counter() - PROCESS_START, "status": solver.status,
            "gap": solver.gap, "variables": solver.num_variables,
            "solve_s": solver.solve_time_s,
            "step_s": planned.plan.predicted.step_time_s}


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:7.1f}"


def _after_export_ratio(row: dict) -> float:
    """Tessel's time after its joint export over AutoParallel's: each tool's own work."""
    ours, peer = row["tessel"], row["autoparallel"]
    return ((ours["planned_s"] - ours["traced_s"])
            / (peer["planned_s"] - peer["traced_s"]))


def print_row(row: dict) -> None:
    peer, ours, default = row["autoparallel"], row["tessel"], row["default"]
    if "error" in peer or "error" in ours or "error" in default:
        print(f"{row['model']:<44} failed: AP {peer.get('error', 'ok')} | "
              f"Tessel {ours.get('error', 'ok')} | default {default.get('error', 'ok')}",
              flush=True)
        return
    like = ours["like_autoparallel"]
    ratio = ours["planned_s"] / peer["planned_s"]
    own = _after_export_ratio(row)
    pinned, bound = ours.get("autoparallel_layout"), ours.get("autoparallel_layout_untied")
    pinned_ms = "-" if pinned is None else f"{pinned['objective_s'] * 1e3:8.3f}"
    bound_ms = "" if bound is None else f" (untied {bound['objective_s'] * 1e3:.3f})"
    print(f"{row['model']:<44} {peer['variables']:>8,} {peer['status']:>8} {peer['planned_s']:7.1f}"
          f" | {like['variables']:>7,} {like['status']:>8} {like['gap']:>6.1%} "
          f"{like['solve_s']:6.2f} {ours['planned_s']:7.1f} | {ratio:5.2f} {own:5.2f} | "
          f"{like['objective_s'] * 1e3:8.3f} {pinned_ms}{bound_ms} | free {ours['free']['status']} "
          f"{ours['free']['gap']:.1%} {ours['free']['solve_s']:.2f}s | untied "
          f"{ours['like_untied']['solve_s']:.2f}s "
          f"{ours['like_untied']['objective_s'] * 1e3:.3f} | default {default['status']} "
          f"{default['gap']:.1%} {default['planned_s']:.1f}s "
          f"({default['planned_s'] / peer['planned_s']:.2f} of AP)", flush=True)


def summarize(rows: list[dict]) -> None:
    done = [r for r in rows if all("error" not in r[k]
                                   for k in ("autoparallel", "tessel", "default"))]
    if not done:
        print("no model planned by both")
        return
    ratios = [r["tessel"]["planned_s"] / r["autoparallel"]["planned_s"] for r in done]
    gaps = [r["tessel"]["like_autoparallel"]["gap"] for r in done]
    ap_s = [r["autoparallel"]["planned_s"] for r in done]
    ours_s = [r["tessel"]["planned_s"] for r in done]
    solves = [r["tessel"]["like_autoparallel"]["solve_s"] for r in done]
    print(f"\n{len(done)} of {len(rows)} models planned by both")
    print(f"time to plan s   AutoParallel median {statistics.median(ap_s):.1f} "
          f"worst {max(ap_s):.1f}"
          f" | Tessel median {statistics.median(ours_s):.1f} worst {max(ours_s):.1f}")
    print(f"ratio    median {statistics.median(ratios):.2f} worst {max(ratios):.2f} "
          f"(Tessel / AutoParallel, like constraints)")
    shared = [min(r["tessel"]["traced_s"], r["autoparallel"]["traced_s"]) for r in done]
    print(f"start shared by both (Python, torch, DTensor, AOTAutograd, the joint export) s "
          f"median {statistics.median(shared):.1f}; over half AutoParallel's time on "
          f"{sum(s > a / 2 for s, a in zip(shared, ap_s))} models")
    after = [_after_export_ratio(r) for r in done]
    print(f"ratio after the joint export  median {statistics.median(after):.2f} "
          f"worst {max(after):.2f} (each tool's own work)")
    untied = [r["tessel"]["like_untied"]["solve_s"] for r in done]
    print(f"untied   solve s median {statistics.median(untied):.2f} worst {max(untied):.2f}"
          f" (the same problems without tying identical blocks)")
    print(f"Tessel ILP solve s  median {statistics.median(solves):.2f} "
          f"worst {max(solves):.2f}")
    optimal = sum(r["tessel"]["like_autoparallel"]["status"] == "OPTIMAL" for r in done)
    print(f"Tessel gap median {statistics.median(gaps):.2%} worst {max(gaps):.2%}; "
          f"optimal on {optimal}")
    default_s = [r["default"]["planned_s"] for r in done]
    default_ok = sum(r["default"]["status"] == "OPTIMAL" for r in done)
    print(f"Tessel's default plan (unconstrained, untied, default time limit): optimal on "
          f"{default_ok} of {len(done)}; time s median {statistics.median(default_s):.1f} "
          f"(AutoParallel's {statistics.median(ap_s):.1f}) worst "
          f"{max(d / a for d, a in zip(default_s, ap_s)):.2f}x AutoParallel's time for its "
          "model")
    for layout, which in (("autoparallel_layout", "blocks tied as it ties them"),
                          ("autoparallel_layout_untied", "untied, a lower bound")):
        for measure in ("objective_s", "step_s"):
            worse = [r["model"] for r in done if r["tessel"].get(layout) and
                     r["tessel"]["like_autoparallel"][measure]
                     > r["tessel"][layout][measure] * (1 + 1e-9)]
            print(f"Tessel's {measure} worse than with AutoParallel's placements "
                  f"({which}) on: {worse or 'none'}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="run only models whose name contains this")
    parser.add_argument("--peer-python", default=PEER_PYTHON)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--side", choices=("autoparallel", "tessel", "default"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--payload", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        payload = json.loads(args.payload)
        spec = spec_from_dict(payload["spec"])
        if args.side == "autoparallel":
            answer = run_autoparallel(spec)
        elif args.side == "default":
            answer = run_default(spec)
        else:
            import torch._functorch.aot_autograd

            from family_planning import run_tessel
            traced = record_joint_export(torch._functorch.aot_autograd)
            answer = {**run_tessel(spec, payload.get("pinned"), PROCESS_START),
                      "traced_s": traced[0]}
        print(json.dumps(answer))
        return 0
    if not Path(args.peer_python).exists():
        print(f"no AutoParallel environment at {args.peer_python}: see this file's docstring")
        return 2
    specs = [s for s in draw_family(args.seed, args.models)
             if not args.only or args.only in s.name]
    print(f"{'model':<44} {'AP vars':>8} {'status':>8} {'AP s':>7} | {'T vars':>7} "
          f"{'status':>8} {'gap':>6} {'solve':>6} {'T s':>7} | ratio  own | "
          f"{'T ms':>8} {'AP ms':>8} | unconstrained | like AP, untied | default plan")
    print("(times: process start to the plan under AutoParallel's constraints; own: the "
          "ratio of the times after the joint export; ms: the ILP's objective, Tessel's "
          "plan vs the best with AutoParallel's placements)")
    rows = []
    for spec in specs:
        rows.append(compare(spec, args.peer_python))
        print_row(rows[-1])
    summarize(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
