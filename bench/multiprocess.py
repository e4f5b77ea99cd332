"""Multi-process jobs: capture overhead against a plain launch, and the cross-process analysis
against XProf's trace_viewer conversion of the same traces.

1. Capture overhead. `fixtures/programs/dp_train.py` as a 4-process JAX job (one CPU device
   each, gloo collectives), launched two ways in the same run, alternately, `--repeat` times:
   - plain: 4 Python processes started at once, each running the script through a 6-line
     bootstrap that gives `jax.distributed.initialize()` its coordinator, process count and id
     (what a cluster launcher does), no profiler;
   - tpudiag: `tpudiag profile --processes 4 --json --out RUN dp_train.py`: the same job under the
     profiler with XLA dumps, then the cross-process analysis and report.json.
   Wall time from launch until every process (and, for tpudiag, the report) is done. Goal: tpudiag
   <= 1.3x plain (best of the runs).
2. Analysis. One 4-process capture whose traces hold about `--events` (default 200k) events each;
   then, best of `--repeat` runs, each in a fresh interpreter:
   - tpudiag: `tpudiag report --json RUN` (reads the 4 traces and 4 HLO dumps, matches every
     collective execution, writes the whole tpudiag.distributed/1 document);
   - XProf: `xspace_to_tool_data([path], "trace_viewer", ...)` of each of the 4 files in turn, in
     one interpreter.
   Goal: tpudiag <= 1.0x XProf.

Prints a table and whether each goal is met; never asserts.

    python bench/multiprocess.py [--steps 60] [--events 200000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "fixtures" / "programs" / "dp_train.py"
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
ENV.pop("XLA_FLAGS", None)
PROCESSES = 4
EVENTS_PER_STEP = 60  # dp_train.py --width 64 on CPU, 1 device per process (measured: ~57-60)
GOAL_CAPTURE, GOAL_ANALYSIS = 1.3, 1.0

# What a cluster launcher provides, in 6 lines: jax.distributed.initialize()'s arguments, and gloo.
BOOT = """
import os, runpy, sys, functools, jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize = functools.partial(jax.distributed.initialize, os.environ["BENCH_COORD"],
    int(os.environ["BENCH_N"]), int(os.environ["BENCH_ID"]))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

XPROF_CODE = """
import sys
from xprof.convert import raw_to_tool_data
for path in sys.argv[1:]:
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {"use_saved_result": False})
    assert data
"""


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def plain(args: list[str]) -> float:
    port = free_port()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", BOOT, str(PROGRAM), *args],
                              env={**ENV, "BENCH_COORD": f"127.0.0.1:{port}", "BENCH_N": str(PROCESSES),
                                   "BENCH_ID": str(i)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
             for i in range(PROCESSES)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            sys.exit(f"plain launch failed ({p.returncode}):\n{err.decode()[-2000:]}")
    return time.perf_counter() - t0


def under_tpudiag(args: list[str], run: Path) -> float:
    if run.exists():
        shutil.rmtree(run)
    t0 = time.perf_counter()
    proc = subprocess.run([*TPUDIAG, "profile", "--processes", str(PROCESSES), "--json", "--out", str(run),
                           str(PROGRAM), "--", *args], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"tpudiag profile --processes failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    return wall


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode()[-2000:]}")
    return time.perf_counter() - t0


def count_events(xplane: Path) -> int:
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(xplane))
    return sum(1 for plane in data.planes for line in plane.lines for _ in line.events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="dp_train.py steps for the capture-overhead runs")
    parser.add_argument("--events", type=int, default=200_000, help="events per process trace for the analysis")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-bench-mp-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        prog = ["--steps", str(args.steps), "--width", "64", "--batch-per-device", "4"]
        walls = {"plain": [], "tpudiag": []}
        for i in range(args.repeat):
            walls["plain"].append(plain(prog))
            walls["tpudiag"].append(under_tpudiag(prog, root / "overhead"))
            print(f"round {i + 1}: plain {walls['plain'][-1]:.2f} s, tpudiag {walls['tpudiag'][-1]:.2f} s", flush=True)
        best_plain, best_td = min(walls["plain"]), min(walls["tpudiag"])

        steps = max(1, round(args.events / EVENTS_PER_STEP))
        run = root / "analysis"
        t0 = time.perf_counter()
        under_tpudiag(["--steps", str(steps), "--width", "64", "--batch-per-device", "4"], run)
        capture_s = time.perf_counter() - t0
        xplanes = [run / x for x in json.loads((run / "manifest.json").read_text())["xplanes"]]
        events = [count_events(x) for x in xplanes]
        print(f"analysis capture: --steps {steps}, {capture_s:.1f} s, events per trace: "
              f"{', '.join(f'{e:,}' for e in events)}", flush=True)
        td = [timed([*TPUDIAG, "report", "--json", str(run)]) for _ in range(args.repeat)]
        xp = [timed([sys.executable, "-c", XPROF_CODE, *map(str, xplanes)]) for _ in range(args.repeat)]

        print("\n1. capture overhead, 4 processes of dp_train.py "
              f"--steps {args.steps} (best of {args.repeat}; wall s)")
        print(f"   plain launch   {best_plain:6.2f}   all: {', '.join(f'{w:.2f}' for w in walls['plain'])}")
        print(f"   tpudiag        {best_td:6.2f}   all: {', '.join(f'{w:.2f}' for w in walls['tpudiag'])}")
        ratio = best_td / best_plain
        print(f"   ratio {ratio:.2f}x (goal <= {GOAL_CAPTURE}x): {'MET' if ratio <= GOAL_CAPTURE else 'MISSED'}")
        print(f"\n2. analysis of 4 traces, {sum(events):,} events in all (best of {args.repeat}; wall s)")
        print(f"   tpudiag report --json   {min(td):6.2f}   all: {', '.join(f'{w:.2f}' for w in td)}")
        print(f"   xprof trace_viewer x4   {min(xp):6.2f}   all: {', '.join(f'{w:.2f}' for w in xp)}")
        ratio = min(td) / min(xp)
        print(f"   ratio {ratio:.2f}x (goal <= {GOAL_ANALYSIS}x): {'MET' if ratio <= GOAL_ANALYSIS else 'MISSED'}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
