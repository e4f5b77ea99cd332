"""`tpudiag estimate`'s probes: modules compiled alone with the TPU compiler's static profile, into
`RUN/estimate/`, to time what the step's own compile does not. The matmul probes (one per distinct
compute-bound matmul, `analyze/compile/matmul_probe.py`) and the kernel step probes (a Pallas
kernel's grid cut to a few steps, `analyze/compile/kernel_body.step_probe`). Also the one file the
kernel passes read: the step's `kernel_tables.json`.

This module compiles and writes files; what the probes measured is applied to the step's ops by
the pure passes (`analyze/compile/estimate_passes.probed_matmuls`,
`analyze/compile/kernel_passes.probed_kernels`).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from tpudiag.capture import rundir

# CPU seconds one probe's static profile may take: a matmul probe profiles in seconds; a few (a
# weight gradient as a windowed convolution) run for minutes, and those take the convolution cost
# model (`estimate_passes.cost_model_matmuls`).
PROBE_STATIC_S = 45.0
PROBES_MAX = 16
# Seconds all matmul probes of a step may take (wall); each probe's static profile is cut at
# PROBE_STATIC_S CPU seconds.
PROBE_BUDGET_S = 300.0
# Wall seconds all kernel step probes of a step may take, and the most kinds of grid step (the values
# of the branches on its tables) probed in one kernel.
KERNEL_PROBE_BUDGET_S = 600.0
KERNEL_PROBE_SIGNATURES = 4


def probe_setup(run: Path, subdir: str, limits):
    """(the directory a pass's probes go in, created; their limits): the static profile stepped
    through, not fast-forwarded (fast-forwarding inflates a large matmul's cycles: tpu_compile.Limits),
    each within PROBE_STATIC_S CPU seconds, and no LLO bundle dump (only the static profile is read)."""
    pdir = Path(run) / rundir.ESTIMATE_DIR / subdir
    pdir.mkdir(parents=True, exist_ok=True)
    return pdir, replace(limits, static_timeout_s=min(limits.static_timeout_s, PROBE_STATIC_S), scale_with_size=False,
                         fast_forward=False, llo_dump=False)


def compile_alone(path: Path, name: str, kind: str, pdir: Path, target, limits):
    """One probe module compiled for `target` with the static profile: its `ModuleReport`."""
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.tpu_compile import ModuleInput

    return compile_inputs([ModuleInput(name=name, path=path, kind=kind)], pdir, target, static_profile=True, jobs=1,
                          limits=limits, suggestions=False, group_setup=False, with_llo=False).modules[0]


def probe_matmuls(report, hlo, run: Path, target, limits, progress=None, limit: int | None = None):
    """(the report with the step's compute-bound matmul fusions timed by the compiler's static cycles
    of their probes, a finding or None, the names of the ops a probe timed). Each distinct matmul is
    compiled alone with the static profile (`analyze/compile/matmul_probe.py`) into
    `RUN/estimate/probes/`; an op takes its probe's time where that is longer than its roofline time
    (`estimate_passes.probed_matmuls`). At most `limit` probes (default `PROBES_MAX`), the largest
    share of the step first."""
    from tpudiag.analyze.compile.estimate_passes import ProbeTime, probed_matmuls
    from tpudiag.analyze.compile.matmul_probe import select_probes

    probes = select_probes(hlo, report.modules[0].ops, PROBES_MAX if limit is None else limit)
    if not probes:
        return report, None, frozenset()
    pdir, probe_limits = probe_setup(run, "probes", limits)
    if progress:
        progress(f"timing up to {len(probes)} distinct matmul(s) with the compiler's static profile, each alone "
                 f"(at most {PROBE_BUDGET_S:.0f} s)")
    seconds, missing, skipped, by_model = {}, 0, 0, set()
    ops = {o.name: o for o in report.modules[0].ops}
    done: dict[str, tuple[int, str]] = {}  # probe text -> (cycles, module): two ops cut to one probe
    t0 = time.monotonic()
    for i, p in enumerate(probes):
        if p.text not in done and time.monotonic() - t0 > PROBE_BUDGET_S:  # the rest: the cost model
            skipped = len(probes) - i
            break
        if p.text not in done:
            path = pdir / f"probe{i:02d}-{p.key}.hlo.txt"
            path.write_text(p.text)
            pm = compile_alone(path, f"probe{i:02d}", "hlo", pdir, target, probe_limits)
            cycles = max((o.estimated_cycles or 0 for o in pm.ops
                          if o.flops > 0 and o.cycles_source == "static_profile"), default=0)
            if not cycles and pm.ok:  # no static cycles: the probe's own cost model, where it has one
                cycles = _probe_cost_model(pm) or 0
                if cycles:
                    by_model.add(p.text)
            done[p.text] = (cycles, pm.name)
        cycles, name = done[p.text]
        if not cycles:
            missing += 1
            continue
        for op in p.ops:
            model = p.text in by_model
            seconds[op] = ProbeTime(round(cycles * p.scale), name, model,
                                    _step_cost_model(hlo, ops.get(op)) if model else None)
    report, note = probed_matmuls(report, seconds, len(probes), missing, skipped, PROBE_BUDGET_S,
                                  by_cost_model=len(by_model))
    return report, note, frozenset(seconds)


def _step_cost_model(hlo, op) -> int | None:
    """The step's own cost-model record for `op` (`matmul_probe.cost_model_cycles`), or None."""
    from tpudiag.analyze.compile.matmul_probe import cost_model_cycles

    instr = hlo.instruction(op.name, op.computation) if op is not None else None
    return cost_model_cycles(hlo, instr) if instr is not None else None


def _probe_cost_model(pm) -> int | None:
    """A compiled probe's own convolution cost model (`matmul_probe.probe_cost_model_cycles`), from its
    optimized HLO; None where the file is missing or records none."""
    from tpudiag.analyze.compile.matmul_probe import probe_cost_model_cycles
    from tpudiag.parse.hlo import read_hlo_file

    path = Path(pm.artifacts or "") / "optimized.hlo.txt"
    try:
        return probe_cost_model_cycles(read_hlo_file(path)) if path.is_file() else None
    except Exception:  # an unreadable dump: the step's cost model stands
        return None


def kernel_tables(report, run: Path) -> dict:
    """{constant name: its values} from the step module's `kernel_tables.json` (the integer tables
    the kernels read, written where the step was lowered); {} where there is none or it is not such a
    map."""
    m = report.modules[0]
    tables_file = Path(run) / rundir.MODULES_DIR / Path(m.artifacts).name / rundir.KERNEL_TABLES
    try:
        tables = json.loads(tables_file.read_text()) if tables_file.is_file() else {}
    except (OSError, ValueError):
        tables = {}
    return {k: v for k, v in tables.items() if isinstance(v, list) and all(type(x) is int for x in v)} \
        if isinstance(tables, dict) else {}


def probe_kernels(report, hlo, works: dict, run: Path, target, limits, progress=None):
    """(the report with the step's Pallas kernels whose matmuls their tables gate timed by the
    compiler's cycles for their grid steps, a finding or None). Such a kernel's own static profile does
    not follow its branches on table values (splash attention's block masks), and its own cost
    estimate, where it gives one, counts FLOPs. So each distinct kernel whose every matmul branch reads
    a table (`kernel_passes.kernels_to_probe`), its steps evaluated from its tables, is compiled alone
    with the static profile into `RUN/estimate/kernel_probes/`, for each kind of step it runs (the
    values its table branches take, `KernelWork.signatures`): twice, its body rewritten by
    `kernel_body.step_probe` (the grid cut to STEP_PROBE steps along its last axis, the branches set
    to that kind's values). The difference is one such step's cycles (`kernel_passes.probed_kernels`
    applies them). The budget is checked before each kind's pair of probes. `works`:
    `kernel_passes.kernel_works`."""
    from tpudiag.analyze.compile.kernel_body import STEP_PROBE, step_probe
    from tpudiag.analyze.compile.kernel_passes import (KernelProbes, first_line, kernel_key, kernels_to_probe,
                                                       probed_kernels)

    probed_works = kernels_to_probe(works)
    if not probed_works:
        return report, None
    pdir, probe_limits = probe_setup(run, "kernel_probes", limits)
    if progress:
        progress(f"timing {len(probed_works)} Pallas kernel op(s) by the compiler's cycles for their grid steps, "
                 f"each kernel alone (at most {KERNEL_PROBE_BUDGET_S:.0f} s)")
    # a megacore device (v5p) splits a kernel's `parallel` grid axes over its TensorCores; a probe, its
    # other axes cut to 1, runs on one of them
    found = KernelProbes(works=probed_works,
                         cores=max(1, target.chip.tensorcores_per_chip // target.chip.devices_per_chip))
    step_cycles, names, status, reasons = found.step_cycles, found.names, found.status, found.reasons
    t0 = time.monotonic()
    for name, (instr, work) in probed_works.items():
        key = kernel_key(hlo, instr)
        todo = [sig for sig, _ in work.signatures if (key, sig) not in step_cycles]
        if len(work.signatures) > KERNEL_PROBE_SIGNATURES:
            status[name] = "short"
            continue
        texts = {sig: [step_probe(instr.backend_config, list(key[1]), instr.shape, n, work, sig) for n in STEP_PROBE]
                 for sig in todo}
        if any(None in pair for pair in texts.values()):  # a last axis too short, or a body not rewritten
            status[name] = "short"
            continue
        pname = names.setdefault(key, f"kprobe{len(names):02d}")
        for sig, pair in texts.items():
            if time.monotonic() - t0 > KERNEL_PROBE_BUDGET_S:
                status[name] = "skipped"
                break
            tag = f"{pname}-kind{sum(1 for k, _ in step_cycles if k == key)}"
            cycles = []
            for n, text in zip(STEP_PROBE, pair):
                path = pdir / f"{tag}-{n}steps.mlir"
                path.write_text(text)
                pm = compile_alone(path, f"{tag}-{n}steps", "mlir", pdir, target, probe_limits)
                got = [o.estimated_cycles for o in pm.ops
                       if o.opcode == "custom-call" and o.cycles_source == "static_profile" and o.estimated_cycles]
                if len(got) != 1:
                    why = pm.error if not pm.ok else pm.static_profile if pm.static_profile != "ok" else "no cycles"
                    reasons.setdefault(f"{tag}-{n}steps", first_line(why))
                    break
                cycles.append(got[0])
            ok = len(cycles) == 2 and cycles[1] > cycles[0]
            if len(cycles) == 2 and not ok:
                reasons.setdefault(tag, f"{STEP_PROBE[1]} steps not slower than {STEP_PROBE[0]}")
            step_cycles[(key, sig)] = (cycles[1] - cycles[0]) / (STEP_PROBE[1] - STEP_PROBE[0]) if ok else None
            if not ok:
                break
    return probed_kernels(report, hlo, found, budget_s=KERNEL_PROBE_BUDGET_S, most_kinds=KERNEL_PROBE_SIGNATURES)
