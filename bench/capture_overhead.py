"""Capture overhead: `tpudiag profile` of a program against a plain `python` run of it.

For each program (`fixtures/programs/decoder.py` and `mlp.py`, `--steps 20` by default) it runs,
each in a subprocess with JAX_PLATFORMS=cpu, alternating, `--repeat` times (default 5):
- plain:   `python PROGRAM --steps 20`
- tpudiag: `tpudiag profile --json --out RUN PROGRAM -- --steps 20` (a fresh RUN each time)
and reports the median wall time of each and their ratio. tpudiag's time is broken down (medians)
into the child's wall (`wall_s` in RUN/manifest.json: the program under the profiler, with dumps,
plus writing the trace), of which the program's own part (`program_end_ns - program_start_ns` in
RUN/capture/child.json), and tpudiag's own part: the total minus the child's wall (CLI start-up,
run directory, analysis, report.json and report.md). For comparison it also times
`tpudiag report --json RUN` on each captured run (the analysis alone, imports included).

Goal: tpudiag / plain <= 1.3x for each program. Prints a table and whether the goal is met;
never asserts.

    python bench/capture_overhead.py [--steps 20] [--repeat 5] [--programs decoder.py mlp.py]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "fixtures" / "programs"
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
GOAL_RATIO = 1.3


def run(cmd: list[str]) -> float:
    """Wall seconds of one subprocess run; stops the benchmark if the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode()[-2000:]}")
    return wall


def measure(program: Path, steps: int, repeat: int, root: Path) -> dict:
    plain, total, child, prog, report, sizes = [], [], [], [], [], []
    for i in range(repeat):
        plain.append(run([sys.executable, str(program), "--steps", str(steps)]))
        out = root / f"{program.stem}-{i}"
        total.append(run([*TPUDIAG, "profile", "--json", "--out", str(out), str(program), "--",
                          "--steps", str(steps)]))
        manifest = json.loads((out / "manifest.json").read_text())
        status = json.loads((out / "capture" / "child.json").read_text())
        child.append(manifest["wall_s"])
        prog.append((status["program_end_ns"] - status["program_start_ns"]) / 1e9)
        report.append(run([*TPUDIAG, "report", "--json", str(out)]))
        sizes.append(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()))
        shutil.rmtree(out)
    med = statistics.median
    return {"plain": med(plain), "total": med(total), "child": med(child), "program": med(prog),
            "own": med(t - c for t, c in zip(total, child)), "report": med(report), "run_bytes": med(sizes),
            "plain_all": plain, "total_all": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="--steps passed to each program")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command; medians are reported")
    parser.add_argument("--programs", nargs="+", default=["decoder.py", "mlp.py"],
                        help="programs under fixtures/programs/")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="tpudiag-bench-"))
    results = []
    try:
        for name in args.programs:
            print(f"measuring {name} --steps {args.steps} ({args.repeat} runs each) ...", flush=True)
            results.append((name, measure(PROGRAMS / name, args.steps, args.repeat, root)))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nmedian of {args.repeat} wall times (s); plain = `python PROGRAM`, tpudiag = "
          "`tpudiag profile --json --out RUN PROGRAM --`\n")
    print(f"{'program':<12} {'plain':>6} {'tpudiag':>8} {'ratio':>6} | {'child':>6} {'program':>8} "
          f"{'tpudiag own':>12} | {'report':>6} {'run dir':>8}")
    for name, r in results:
        print(f"{name:<12} {r['plain']:>6.2f} {r['total']:>8.2f} {r['total'] / r['plain']:>5.2f}x | "
              f"{r['child']:>6.2f} {r['program']:>8.2f} {r['own']:>12.2f} | "
              f"{r['report']:>6.2f} {r['run_bytes'] / 2**20:>4.1f} MiB")
    print("\n  child = manifest wall_s (the profiled child process); program = the script's own run inside"
          " it;\n  tpudiag own = total - child (CLI start-up, analysis, report writing);"
          " report = `tpudiag report --json RUN` alone")
    for name, r in results:
        print(f"  all runs, {name}: plain {', '.join(f'{w:.2f}' for w in r['plain_all'])};"
              f" tpudiag {', '.join(f'{w:.2f}' for w in r['total_all'])}")

    print("\ngoals")
    for name, r in results:
        ratio = r["total"] / r["plain"]
        print(f"  {name}: tpudiag / plain <= {GOAL_RATIO}x: {ratio:.2f}x  {'MET' if ratio <= GOAL_RATIO else 'MISSED'}")


if __name__ == "__main__":
    main()
