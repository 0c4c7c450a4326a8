"""How well Tessel predicts the peak memory of published runs: every row of
`../shared/calibration/published_memory.csv`, predicted as its engine runs it and compared
like with like (TorchTitan logs the allocator's peak reserved bytes, Megatron-LM its peak
allocated bytes).

Targets (issue 29): every row within 10%; a row that ran out of memory predicted not to
fit, or for the run that ran out through fragmentation flagged by the reserved estimate;
rows that ran predicted to fit. The MoE rows (DeepSeek-V3-16B on TorchTitan, Moonlight-16B
on Megatron-Bridge: multi-latent attention, shared and routed experts, a dense first
layer) are read from their model and notes columns.

TorchTitan's throughput on the same machines (`../shared/calibration/
published_torchtitan_runs.csv`; issue 43): each row within 15% of its measured tokens/s
per GPU. Beside every fit, each row's leave-one-out prediction: from the fit without it.

    .venv/bin/python benchmarks/memory_accuracy.py [--json PATH]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.engine_memory import FRAGMENTATION  # noqa: E402
from cost_models.published_memory import (  # noqa: E402
    SPEED_FITTED,
    fragmentation_fit,
    fragmentation_leave_one_out,
    fragmentation_rows,
    predict,
    read_runs,
    speed_leave_one_out,
)

TARGET = 0.10
SPEED_TARGET = 0.15


def main() -> int:
    runs, skipped = read_runs()
    results = [predict(run) for run in runs]
    print(f"{'line':>4}  {'run':<24} {'engine':<10} {'kind':<9} {'measured':>8} "
          f"{'predicted':>9} {'error':>7}  fits  verdict")
    for r in results:
        measured = f"{r.run.measured_gib:.1f}" if r.run.measured_gib is not None else "-"
        error = f"{r.error:+.1%}" if r.error is not None else "-"
        verdict = "ok" if r.verdict_ok else "WRONG"
        fits = ("yes" if r.fits else "no") + ("" if r.reserved_fits else "/flag")
        print(f"{r.run.line:>4}  {r.run.name:<24} {r.run.parallel.execution.engine:<10} "
              f"{r.run.kind:<9} {measured:>8} {r.predicted_gib:>9.1f} {error:>7}  "
              f"{fits:<5} {verdict}")
    for line, model, why in skipped:
        print(f"{line:>4}  skipped {model.split(' (')[0]}: {why}")
    # FRAGMENTATION was fitted on TorchTitan's dense rows (the Llama 3.1 8B runs).
    fitted = fragmentation_rows(results)
    print(f"\nfit: TorchTitan's reserved over predicted allocated on its {len(fitted)} "
          "dense rows "
          f"{', '.join(f'{r.run.measured_gib / r.allocated_gib:.3f}' for r in fitted)}, "
          f"mean {1 + fragmentation_fit(fitted):.3f} "
          f"(engine_memory.FRAGMENTATION: {1 + FRAGMENTATION['torchtitan']:.3f})")
    print("leave-one-out (refitted on the other rows):")
    for run, shipped, held_out in fragmentation_leave_one_out():
        print(f"{run.line:>4}  {run.name:<24} measured {run.measured_gib:5.1f} predicted "
              f"{shipped:5.1f} {shipped / run.measured_gib - 1:+.1%}, left out "
              f"{held_out:5.1f} {held_out / run.measured_gib - 1:+.1%}")
    print("\nTorchTitan's throughput (published_torchtitan_runs.csv), tokens/s per GPU; "
          f"target within {SPEED_TARGET:.0%}:")
    print(f"fitted to these rows: {', '.join(SPEED_FITTED) or 'nothing (mechanisms only)'}"
          "; left out: predicted by the fit without the row")
    speed_errors = []
    for speed, predicted, held_out in speed_leave_one_out():
        error, loo = (x / speed.tokens_per_s_per_gpu - 1 for x in (predicted, held_out))
        speed_errors.append(abs(error))
        print(f"{speed.line:>4}  {speed.run.name:<24} "
              f"{speed.run.parallel.numerics.precision:<5} "
              f"compile={speed.run.parallel.execution.compile!s:<5} measured "
              f"{speed.tokens_per_s_per_gpu:>6,.0f} predicted {predicted:>6,.0f} {error:+6.1%}"
              f"  left out {held_out:>6,.0f} {loo:+6.1%}  "
              f"{'ok' if abs(error) <= SPEED_TARGET else 'MISSED'}")
    speed_within = sum(e <= SPEED_TARGET for e in speed_errors)
    errors = [abs(r.error) for r in results if r.error is not None]
    within = sum(e <= TARGET for e in errors)
    verdicts = sum(r.verdict_ok for r in results)
    print(f"\n{within}/{len(errors)} measured rows within {TARGET:.0%} (mean |error| "
          f"{sum(errors) / len(errors):.1%}); {verdicts}/{len(results)} fit verdicts right; "
          f"{len(skipped)} rows skipped; {speed_within}/{len(speed_errors)} TorchTitan "
          f"throughput rows within {SPEED_TARGET:.0%}")
    if "--json" in sys.argv:
        out = Path(sys.argv[sys.argv.index("--json") + 1])
        out.write_text(json.dumps([{
            "line": r.run.line, "run": r.run.name, "engine": r.run.parallel.execution.engine,
            "kind": r.run.kind, "measured_gib": r.run.measured_gib,
            "predicted_gib": r.predicted_gib, "error": r.error, "fits": r.fits,
            "reserved_fits": r.reserved_fits, "verdict_ok": r.verdict_ok,
        } for r in results], indent=1))
    return 0 if within == len(errors) and verdicts == len(results) \
        and speed_within == len(speed_errors) else 1


if __name__ == "__main__":
    raise SystemExit(main())
