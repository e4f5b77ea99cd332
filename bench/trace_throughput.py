"""Trace throughput: `tpudiag report --json RUN` against XProf's own trace_viewer conversion.

Measures, on one real trace of about `--events` (default 400k) events captured from
`fixtures/programs/many_calls.py` by `tpudiag profile`, and then on a second trace with twice
as many events:
- the wall time (best of `--repeat`, default 3) and peak RSS (max over the runs) of
  `tpudiag report --json RUN` (the full report: xplane, HLO dump, compile log) in a subprocess;
- the same for XProf's conversion of the same `.xplane.pb` to trace-viewer JSON
  (`xprof.convert.raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", ...)`, with
  `use_saved_result` off so every run converts afresh) in a subprocess.
Peak RSS is the child's own `ru_maxrss` from `os.wait4`, so each subprocess is measured alone.

Goals: tpudiag time <= 1.0x XProf's; tpudiag peak RSS < 2 GB; tpudiag time on the doubled
trace <= 2.2x its time on the first. Prints a table and whether each goal is met; never asserts.

    python bench/trace_throughput.py [--events 400000] [--keep DIR] [--repeat 3]
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
PROGRAM = REPO / "fixtures" / "programs" / "many_calls.py"
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
FIRST_GUESS_CALLS = 20000  # many_calls.py default; ~15 trace events per call on CPU (measured)
TOLERANCE = 0.10  # a trace within 10% of the target event count is close enough
GOAL_TIME_RATIO, GOAL_RSS_BYTES, GOAL_DOUBLING = 1.0, 2 * 1024**3, 2.2

# Runs in its own interpreter. The event count is taken after the conversion and its cost is
# reported, so the caller can take it out of the measured wall time.
XPROF_CODE = """
import json, sys, time
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "trace_viewer", {"use_saved_result": False})
t = time.perf_counter()
data = data or ""
doc = {"bytes": len(data), "events": data.count('"ph": "X"'), "count_s": time.perf_counter() - t}
print(json.dumps(doc))
"""


def count_events(xplane: Path) -> int:
    """All events on all lines of all planes, as XLA's own reader sees them."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(xplane))
    return sum(1 for plane in data.planes for line in plane.lines for _ in line.events)


def find_xplane(run: Path) -> Path | None:
    found = sorted(run.glob("trace/**/*.xplane.pb"))
    return found[-1] if found else None


def capture(calls: int, run: Path) -> Path:
    if run.exists():
        shutil.rmtree(run)
    cmd = [*TPUDIAG, "profile", "--json", "--out", str(run), str(PROGRAM), "--", "--calls", str(calls)]
    proc = subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    xplane = find_xplane(run)
    if proc.returncode != 0 or xplane is None:
        sys.exit(f"capture failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode()[-2000:]}")
    return xplane


def make_trace(target: int, root: Path, guess_calls: int) -> tuple[Path, int, int]:
    """A run whose trace has about `target` events: (run dir, events, calls). Reused if kept."""
    run = root / f"many_calls-{target}"
    info = run.parent / f"{run.name}.json"
    if info.is_file() and find_xplane(run):
        doc = json.loads(info.read_text())
        print(f"reusing {run} ({doc['events']} events, --calls {doc['calls']})", flush=True)
        return run, doc["events"], doc["calls"]
    calls = guess_calls
    for _ in range(4):
        t0 = time.perf_counter()
        events = count_events(capture(calls, run))
        print(f"captured --calls {calls}: {events} events ({time.perf_counter() - t0:.1f} s)", flush=True)
        if abs(events - target) <= TOLERANCE * target:
            break
        calls = max(1, round(calls * target / events))  # events grow linearly with calls
    info.write_text(json.dumps({"events": events, "calls": calls}))
    return run, events, calls


def timed(cmd: list[str]) -> tuple[float, int, bytes]:
    """(wall s, peak RSS bytes of this child alone, stdout) of one subprocess run."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=ENV, stdout=out, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss * 1024, out.read()  # ru_maxrss is in KiB on Linux


def measure(run: Path, repeat: int) -> dict:
    xplane = find_xplane(run)
    td = [timed([*TPUDIAG, "report", "--json", str(run)]) for _ in range(repeat)]
    xp = []
    for _ in range(repeat):
        wall, rss, out = timed([sys.executable, "-c", XPROF_CODE, str(xplane)])
        doc = json.loads(out.decode().strip().splitlines()[-1])
        xp.append((wall - doc["count_s"], rss, doc))
    return {
        "xplane_bytes": xplane.stat().st_size,
        "tpudiag_s": min(w for w, _, _ in td), "tpudiag_rss": max(r for _, r, _ in td),
        "tpudiag_all": [w for w, _, _ in td], "report_bytes": len(td[0][2]),
        "xprof_s": min(w for w, _, _ in xp), "xprof_rss": max(r for _, r, _ in xp),
        "xprof_all": [w for w, _, _ in xp], "xprof_json_bytes": xp[0][2]["bytes"],
        "xprof_json_events": xp[0][2]["events"],
    }


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000, help="target events in the first trace")
    parser.add_argument("--keep", type=Path, default=None, help="keep (and reuse) the generated runs here")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; best time is reported")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        run1, ev1, calls1 = make_trace(args.events, root, FIRST_GUESS_CALLS)
        run2, ev2, _ = make_trace(2 * args.events, root, round(calls1 * 2 * args.events / ev1))
        results = []
        for run, events in ((run1, ev1), (run2, ev2)):
            print(f"measuring {events:,} events ...", flush=True)
            results.append((events, measure(run, args.repeat)))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\nbest of {args.repeat} wall time, peak RSS = max over runs (tpudiag = `tpudiag report --json RUN`,"
          " xprof = xspace_to_tool_data(..., 'trace_viewer'))\n")
    print(f"{'events':>10} {'xplane':>9} {'tpudiag s':>10} {'xprof s':>9} {'ratio':>6} "
          f"{'tpudiag RSS':>12} {'xprof RSS':>10} {'report.json':>12} {'xprof JSON':>11} {'JSON events':>12}")
    for events, r in results:
        print(f"{events:>10,} {mb(r['xplane_bytes']):>9} {r['tpudiag_s']:>10.2f} {r['xprof_s']:>9.2f} "
              f"{r['tpudiag_s'] / r['xprof_s']:>5.2f}x {mb(r['tpudiag_rss']):>12} {mb(r['xprof_rss']):>10} "
              f"{r['report_bytes'] / 1024:>9.0f} KiB {mb(r['xprof_json_bytes']):>11} {r['xprof_json_events']:>12,}")
    for events, r in results:
        print(f"  all runs at {events:,} events: tpudiag {', '.join(f'{w:.2f}' for w in r['tpudiag_all'])} s;"
              f" xprof {', '.join(f'{w:.2f}' for w in r['xprof_all'])} s")

    (e1, r1), (e2, r2) = results
    ratio = max(r1["tpudiag_s"] / r1["xprof_s"], r2["tpudiag_s"] / r2["xprof_s"])
    peak = max(r1["tpudiag_rss"], r2["tpudiag_rss"])
    doubling = r2["tpudiag_s"] / r1["tpudiag_s"]
    print("\ngoals")
    print(f"  tpudiag time / xprof time <= {GOAL_TIME_RATIO}x: {ratio:.2f}x (worse of the two sizes)"
          f"  {verdict(ratio <= GOAL_TIME_RATIO)}")
    print(f"  tpudiag peak RSS < {mb(GOAL_RSS_BYTES)}: {mb(peak)}  {verdict(peak < GOAL_RSS_BYTES)}")
    print(f"  tpudiag time at {e2 / e1:.2f}x events <= {GOAL_DOUBLING}x: {doubling:.2f}x"
          f" (xprof: {r2['xprof_s'] / r1['xprof_s']:.2f}x)  {verdict(doubling <= GOAL_DOUBLING)}")


if __name__ == "__main__":
    main()
