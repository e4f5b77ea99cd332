"""tpudiag against XProf's own `hlo_stats` converter on TPU run directories, one line per run.

    python bench/tpu_vs_xprof.py fixtures/tpu-v5e/*/          # the stored v5e runs (any machine)
    python bench/tpu_vs_xprof.py RUN [RUN...]                 # runs just captured on a TPU

For each run: op time joined to the HLO dump, device busy time (tpudiag) against XProf's total self
time, the largest difference among the top-10 ops' self times, the compute share of busy time both
ways, the share of op time whose bound agrees, the top-10 source lines that agree, and the time each
reader took (XProf's converter is the peer). Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _row(run: Path) -> str:
    from tpudiag.api.profiling import analyze_run
    from tpudiag.parse.xplane import read_xplane
    from tpudiag.parse.xprof_tools import hlo_stats

    xplane = next(run.glob("trace/plugins/profile/*/*.xplane.pb"))
    t = time.perf_counter()
    r = analyze_run(run)
    ours_s = time.perf_counter() - t
    t = time.perf_counter()
    trace = read_xplane(xplane)
    x = hlo_stats(xplane, {p.fingerprint: p.module_id for p in trace.device.programs})
    xprof_s = time.perf_counter() - t
    total = sum(o.self_s for o in r.ops) or 1.0
    joined = sum(o.self_s for o in r.ops if o.opcode != "?") / total
    theirs = {(int(p), o): (us * 1e-6, b, s) for p, o, us, b, s in
              zip(x["program_id"], x["op"], x["self_us"], x["bound_by"], x["source"])}
    top = [o for o in r.ops[:10] if (o.program_id, o.name) in theirs]
    worst = max((abs(o.self_s / theirs[(o.program_id, o.name)][0] - 1) for o in top
                 if theirs[(o.program_id, o.name)][0]), default=0.0)
    agree = sum(o.self_s for o in r.ops if o.measured and o.measured.bound_by and (o.program_id, o.name) in theirs
                and o.measured.bound_by.replace("_", " ") == str(theirs[(o.program_id, o.name)][1]).lower())
    judged = sum(o.self_s for o in r.ops if o.measured and o.measured.bound_by and (o.program_id, o.name) in theirs
                 and theirs[(o.program_id, o.name)][1] != "Unknown") or 1.0
    sources = [(o, theirs[(o.program_id, o.name)][2]) for o in top if isinstance(theirs[(o.program_id, o.name)][2], str)]
    same = sum(1 for o, s in sources if o.source and Path(o.source).name == Path(s).name)
    xprof_busy = x["self_us"].sum() * 1e-6
    xprof_compute = x.loc[x["bound_by"] == "Compute", "self_us"].sum() * 1e-6 / xprof_busy if xprof_busy else 0.0
    d = r.device
    return (f"| {run.name} | {joined:.1%} | {d.busy_s * 1e3:.3f} | {xprof_busy * 1e3:.3f} | {worst:.2%} | "
            f"{d.compute_s / d.busy_s:.1%} | {xprof_compute:.1%} | {agree / judged:.1%} | {same}/{len(sources)} | "
            f"{ours_s:.2f} | {xprof_s:.2f} |")


def main(argv: list[str]) -> None:
    runs = [Path(a) for a in argv] or sorted(p for p in Path("fixtures/tpu-v5e").iterdir() if (p / "manifest.json").is_file())
    print("| run | op time joined | busy ms (tpudiag) | busy ms (XProf) | top-10 self, worst | compute share "
          "(tpudiag) | compute share (XProf) | bound agrees | top sources equal | tpudiag s | XProf s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        print(_row(run), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
