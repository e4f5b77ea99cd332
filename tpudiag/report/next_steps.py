"""What to run after a first `tpudiag profile`: a few commands chosen from what the run found, and
the terms its report uses. `profile` prints them under its report (terminal output only).

- Compile time over a third of the traced window, or no step traced: trace the steady state with
  tpudiag's own `--steps N --skip K`, which go before the script (the program's own options go after
  it and `--`).
- A run off the TPU without `--target`: the same run compiled for a TPU, with per-op estimates.
- A run with TPU times (measured or estimated): which ops deserve a Pallas kernel (`suggest`).
No I/O.
"""

from __future__ import annotations

import shlex

COMPILE_SHARE = 1 / 3

TERMS = ("self: an op's own time, without the ops it calls; share: of the traced window (of the device's "
         "busy time on a TPU); idle: neither host nor device doing tracked work; compile: jax and XLA "
         "compiling (docs/breakdown.md has every term)")


def next_steps(report, script: str, args: tuple[str, ...] = ()) -> list[str]:
    """Commands (with why) for the run `report` of `script` ARGS; empty for a run that failed."""
    if report.status != "ok":
        return []
    run = shlex.quote(str(report.artifacts.get("run_dir") or "RUN"))
    prog = shlex.join([script, *(["--", *args] if args else [])])
    out = []
    compile_share = report.breakdown_share.get("compile") or 0.0
    if report.steps.count == 0 or compile_share > COMPILE_SHARE:
        why = (f"compile took {compile_share:.0%} of the traced window" if compile_share > COMPILE_SHARE
               else "no step was traced (the program has no jax.profiler.StepTraceAnnotation)")
        out.append(f"{why}: trace the steady state with tpudiag's own --steps and --skip, before the script: "
                   f"tpudiag profile --steps 3 --skip 2 {prog}")
    if report.backend != "tpu" and report.tpu_estimate is None:
        out.append(f"what it would take on a TPU, op by op: tpudiag profile --target v5e {prog}")
    if report.backend == "tpu" or report.tpu_estimate is not None:
        out.append(f"which ops deserve a Pallas kernel, and the gain: tpudiag suggest {run}")
    out.append(f"this report again, or as JSON: tpudiag report {run} [--json]")
    return out
