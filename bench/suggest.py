"""`tpudiag suggest` on every fixture program for v5e: the suggestion, its expected speedup, and the time
suggest adds beyond the compile it needs, with a warm compile cache.

For each program in fixtures/programs/ that the detectors are written for, in one run:
1. `tpudiag compile --target v5e --cache-dir CACHE --out RUN PROGRAM` twice (the first fills the cache);
   the second's wall time is the peer: the compile suggest needs, warm;
2. `tpudiag suggest --cache-dir CACHE --json RUN` twice (the first compiles the kernels at the matched
   shapes into the cache); the second's wall time is the command's, warm;
3. `api.suggest_run(RUN)` in a fresh process whose imports (jax, pandas, tpudiag) are done first, best
   of 2 processes: what suggest adds to a `tpudiag suggest SCRIPT`, whose process has already imported
   everything for the compile. It lowers the kernels again (no lowering is cached) and copies their
   compiles from the cache.
Goal: suggest warm <= 20% of the compile warm; judged on (3), (2) shown beside it. `--no-static-profile` by default
(the Qwen-style block's static profile does not fit 8 GiB, bench/RESULTS.md); `--static` turns it on.
Prints a table and the goal; never asserts.

    python bench/suggest.py [--static] [--keep DIR]
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
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = ["qwen_block", "decode_step", "lm_head", "sampler", "int8_layer", "moe_layer", "layout_waste", "mlp"]
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
GOAL = 0.20


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=ENV, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return wall, p.stdout


_IN_PROCESS = """
import os, sys, time
from pathlib import Path
import jax, pandas  # what a `tpudiag suggest SCRIPT` process has imported by the time it suggests
import tpudiag.api.suggest as S
import tpudiag.kernels.at_shapes, tpudiag.kernels.registry
t = time.perf_counter()
S.suggest_run(Path(sys.argv[1]), static_profile=sys.argv[2] == "1")
print(time.perf_counter() - t)
"""


def in_process(run: Path, cache: Path, no_static: bool) -> float:
    """One `api.suggest_run(RUN)` in a fresh process whose imports are done (best of 2 processes)."""
    env = {**ENV, "TPUDIAG_CACHE_DIR": str(cache)}
    env.pop("TPUDIAG_NO_CACHE", None)
    best = float("inf")
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _IN_PROCESS, str(run), "0" if no_static else "1"], env=env,
                           cwd=REPO, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"in-process suggest failed: {p.stderr[-2000:]}")
        best = min(best, float(p.stdout.strip().splitlines()[-1]))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", action="store_true", help="with the static profile (default: without)")
    parser.add_argument("--keep", type=Path, help="keep the runs and the cache here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-bench-suggest-"))
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "cache"
    static = [] if args.static else ["--no-static-profile"]
    rows = []
    try:
        for name in PROGRAMS:
            run = root / name
            compile_cmd = [*TPUDIAG, "compile", "--target", "v5e", "--json", *static, "--cache-dir", str(cache)]
            cold_compile, _ = timed([*compile_cmd, "--out", str(run), f"fixtures/programs/{name}.py"])
            warm_compile, _ = timed([*compile_cmd, "--out", str(root / f"{name}-warm"),
                                     f"fixtures/programs/{name}.py"])
            suggest_cmd = [*TPUDIAG, "suggest", "--json", *static, "--cache-dir", str(cache), str(run)]
            cold_suggest, _ = timed(suggest_cmd)
            warm_suggest, out = timed(suggest_cmd)
            doc = json.loads(out)
            inproc = in_process(run, cache, not args.static)
            shown = [s for s in doc["suggestions"] if s["shown"]]
            top = shown[0] if shown else None
            rows.append((name, top, len(doc["suggestions"]), len(doc["findings"]), cold_compile, warm_compile,
                         cold_suggest, warm_suggest, inproc))
            print(f"{name}: done", file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\n{datetime.now():%Y-%m-%d %H:%M}; target v5e, {'static profile on' if args.static else '--no-static-profile'}; "
          "seconds\n")
    print(f"{'program':<13} {'top suggestion':<40} {'speedup':>8} {'saved':>9} {'matches':>7} {'finds':>5} | "
          f"{'compile':>7} {'warm':>6} {'suggest':>7} {'warm':>6} {'cmd/c':>6} {'in-proc':>7} {'share':>6}")
    worst = 0.0
    for name, top, n, nf, cc, wc, cs, ws, ip in rows:
        what = f"{top['pattern']} -> {top['kernel'] or 'bound'}" if top else "none"
        speed = f"{top['expected_speedup']:.2f}x" if top and top["expected_speedup"] else "-"
        saved = f"{top['saved_s'] * 1e6:.1f} us" if top and top["saved_s"] is not None else "-"
        share = ip / wc
        worst = max(worst, share)
        print(f"{name:<13} {what:<40} {speed:>8} {saved:>9} {n:>7} {nf:>5} | {cc:>7.1f} {wc:>6.1f} {cs:>7.1f} "
              f"{ws:>6.1f} {ws / wc:>6.0%} {ip:>7.2f} {share:>6.0%}")
    print("\n  compile = `tpudiag compile` wall, first (fills the cache) and again (warm);"
          "\n  suggest = `tpudiag suggest RUN` wall, first (compiles the kernels) and again (warm);"
          "\n  cmd/c = the suggest command warm / compile warm; in-proc = api.suggest_run after the imports, warm;"
          "\n  share = in-proc / compile warm; matches = suggestion rows (shown and hidden); finds = findings")
    print("\ngoal")
    print(f"  suggest (in-process, warm) <= {GOAL:.0%} of the compile warm, every program: worst {worst:.0%}  "
          f"{'MET' if worst <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
