"""What to run after a first `tpudiag profile`: a few commands chosen from what the run found, and
the terms its report uses. `profile` prints them under its report (terminal output only).

- Compile time over a third of the traced window: trace the steady state with tpudiag's own
  `--steps N --skip K`, which go before the script (the program's own options go after it and `--`),
  with N and K that the run's own steps can fill (a command that selects no step fails); a program
  of one step is told to run more first. A window that was already chosen with --steps and still
  compiles recompiles in its steady state: that is what is said.
- No step traced: the program marks none (`jax.profiler.StepTraceAnnotation`, which --steps counts):
  how to mark one, since --steps would select nothing.
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


def next_steps(report, script: str, args: tuple[str, ...] = (), steps: int | None = None, skip: int = 0) -> list[str]:
    """Commands (with why) for the run `report` of `script` ARGS, traced with tpudiag's own `--steps`
    and `--skip` (None: the whole run); empty for a run that failed."""
    if report.status != "ok":
        return []
    run = shlex.quote(str(report.artifacts.get("run_dir") or "RUN"))
    prog = shlex.join([script, *(["--", *args] if args else [])])
    out = []
    compile_share = report.breakdown_share.get("compile") or 0.0
    count = report.steps.count
    if count == 0:
        out.append("no step was traced: the program marks none, and tpudiag's --steps counts the steps it marks; "
                   "wrap one iteration of its loop in `with jax.profiler.StepTraceAnnotation(\"step\", step_num=i):`, "
                   f"then: tpudiag profile --steps 3 --skip 2 {prog}")
    elif compile_share > COMPILE_SHARE and steps is not None:
        out.append(f"compile took {compile_share:.0%} of the traced steps (--skip {skip} --steps {steps}): the "
                   "program compiles again in its steady state; the Compilation table says which functions")
    elif compile_share > COMPILE_SHARE and count == 1:
        out.append(f"compile took {compile_share:.0%} of the traced window and the program ran one step: have it "
                   "run more (its own options go after --), and trace the later ones with tpudiag's own "
                   f"--steps and --skip: tpudiag profile --steps 3 --skip 2 {shlex.quote(script)} -- OPTIONS")
    elif compile_share > COMPILE_SHARE:
        k = min(2, count - 1)  # the first steps compile; the window must still hold at least one step
        out.append(f"compile took {compile_share:.0%} of the traced window: trace the steady state with tpudiag's "
                   f"own --steps and --skip, before the script: tpudiag profile --steps {min(3, count - k)} --skip {k} "
                   f"{prog}")
    if report.backend != "tpu" and report.tpu_estimate is None:
        out.append(f"what it would take on a TPU, op by op: tpudiag profile --target v5e {prog}")
    if report.backend == "tpu" or report.tpu_estimate is not None:
        out.append(f"which ops deserve a Pallas kernel, and the gain: tpudiag suggest {run}")
    out.append(f"this report again, or as JSON: tpudiag report {run} [--json]")
    return out
