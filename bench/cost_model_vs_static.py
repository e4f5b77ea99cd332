"""The compiler's convolution cost model against its static profile, on the matmul probes of estimates.

Each probe (`RUN/estimate/probes/modules/NN-probeNN`: one matmul of a published step, compiled alone
with the static profile, loops stepped through) carries two compiler figures for its matmul fusion:
the static profile's cycles, and the cycles the convolution emitter's cost model gave the tiling it
chose (`window_config` in the executable's HLO, what `tpudiag estimate` takes for the matmuls no
probe times). This prints both for every probe of the runs given, their ratio where both exist, and
each against the MXU peak. No compile: it reads the runs `bench/fidelity.py --keep DIR` left.

    python bench/cost_model_vs_static.py DIR/*-maxtext
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def probe_rows(run: Path):
    """(probe, GFLOP, static cycles or None, cost-model cycles or None, MXU-peak cycles) per probe of `run`."""
    from tpudiag.analyze.compile.matmul_probe import cost_model_cycles
    from tpudiag.api.pipeline import report_from_modules
    from tpudiag.capture.tpu_compile import load_module
    from tpudiag.parse.hlo import read_hlo_file
    from tpudiag.targets import resolve_target

    doc = json.loads((run / "estimate.json").read_text())
    target = resolve_target(doc["target"]["topology"])
    per_cycle = target.chip.peak_bf16_flops_per_s / target.chip.devices_per_chip / target.chip.clock_hz
    mdirs = sorted((run / "estimate" / "probes" / "modules").glob("*-probe*"))
    for mdir in mdirs:
        mc = load_module(mdir)
        if mc.status != "ok":
            continue
        _, report = report_from_modules(target, [mc], {}, with_llo=False, suggestions=False)
        hlo = read_hlo_file(mdir / "optimized.hlo.txt")  # the executable's HLO, with the fusions' configs
        for o in report.modules[0].ops:
            instr = hlo.instruction(o.name, o.computation)
            model = cost_model_cycles(hlo, instr) if instr is not None else None
            if model is None and o.flops <= 0:
                continue
            static = o.estimated_cycles if o.cycles_source == "static_profile" and o.estimated_cycles else None
            if model is None and static is None:
                continue
            yield mdir.name.split("-", 1)[1], o.flops / 1e9, static, model, o.flops / per_cycle


def _n(cycles: int | None) -> str:
    return f"{cycles:,}" if cycles else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="estimate run directories (with estimate/probes/)")
    a = ap.parse_args()
    for run in a.runs:
        if not (run / "estimate.json").is_file():
            print(f"{run}: not an estimate run (no estimate.json)", file=sys.stderr)
            return 2
    ratios = []
    print("| run | probe | GFLOP | static cycles | cost model cycles | model / static | static / peak | model / peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for run in a.runs:
        for probe, gflop, static, model, peak in probe_rows(run):
            ratio = model / static if model and static else None
            if ratio:
                ratios.append(ratio)
            print(f"| {run.name} | {probe} | {gflop:,.1f} | {_n(static)} | {_n(model)} | "
                  f"{f'{ratio:.2f}' if ratio else '-'} | {f'{static / peak:.2f}' if static else '-'} | "
                  f"{f'{model / peak:.2f}' if model else '-'} |")
    if ratios:
        ratios.sort()
        close = sum(0.9 <= round(r, 2) <= 1.11 for r in ratios)
        print(f"\nboth figures on {len(ratios)} probe(s): model / static {ratios[0]:.2f}-{ratios[-1]:.2f}, "
              f"median {statistics.median(ratios):.2f}; within 0.90-1.11x on {close}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
