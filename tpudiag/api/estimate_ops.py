"""What `tpudiag estimate`'s passes share: the step's ops re-ranked, an op re-timed by the compiler's
cycles, and a probe module compiled alone with the static profile."""

from __future__ import annotations

from pathlib import Path

from tpudiag.capture import rundir

# CPU seconds one probe's static profile may take: a matmul probe profiles in seconds; a few (a
# weight gradient as a windowed convolution) run for minutes, and those take the convolution cost
# model (`estimate._cost_model_matmuls`).
PROBE_STATIC_S = 45.0


from tpudiag.analyze.compile.calibrated import with_step as _with_step  # noqa: F401  (the passes here share it)


def _at_cycles(op, cycles: int, clock: float, source: str, limit: str):
    """`op` timed by the compiler's `cycles` where they are longer than its time; else `op` itself."""
    from dataclasses import replace

    if cycles / clock <= op.estimated_s:
        return op
    return replace(op, estimated_s=round(cycles / clock, 12), estimated_cycles=cycles, bound_by="static_cycles",
                   cycles_source=source, limit=limit)


def _probe_setup(run: Path, subdir: str, limits):
    """(the directory a pass's probes go in, created; their limits): the static profile stepped
    through, not fast-forwarded (fast-forwarding inflates a large matmul's cycles: tpu_compile.Limits),
    each within PROBE_STATIC_S CPU seconds, and no LLO bundle dump (only the static profile is read)."""
    from dataclasses import replace

    pdir = Path(run) / rundir.ESTIMATE_DIR / subdir
    pdir.mkdir(parents=True, exist_ok=True)
    return pdir, replace(limits, static_timeout_s=min(limits.static_timeout_s, PROBE_STATIC_S), scale_with_size=False,
                         fast_forward=False, llo_dump=False)


def _compile_alone(path: Path, name: str, kind: str, pdir: Path, target, limits):
    """One probe module compiled for `target` with the static profile: its `ModuleReport`."""
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.tpu_compile import ModuleInput

    return compile_inputs([ModuleInput(name=name, path=path, kind=kind)], pdir, target, static_profile=True, jobs=1,
                          limits=limits, suggestions=False, group_setup=False, with_llo=False).modules[0]
