"""Is a change slower? Runs `trace_throughput.py` and `hlo_parse.py` (this tree's scripts) against two
trees of tpudiag in one run: a base commit and the working tree, alternately, on the same inputs.

The base commit's tracked files are exported with `git archive` to a temporary folder and put first
on PYTHONPATH for its runs (that path comes before the editable install's finder, so `tpudiag` and
the profiled child import the base's code); the working tree's runs use the same scripts with this
tree first. Both report on the same traces (`--keep`, captured once) and parse the same modules.

Goal: the working tree within 10% of the base on report time (both trace sizes), HLO parse time
and the 15-vs-16-layer diff. Prints every figure and each goal; never asserts.

    python bench/compare_trees.py --base 807d960 [--head REV] [--keep DIR] [--rounds 2]

`--head REV` measures that commit (exported like the base) instead of the working tree, so the tree
can be edited while the benchmark runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 1.10  # working tree / base, at most


def _export(rev: str, dest: Path) -> None:
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def _run(script: str, tree: Path, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{script} on {tree} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def _trace_figures(out: str) -> dict[str, float]:
    """`tpudiag s` per trace size from trace_throughput's table."""
    rows = re.findall(r"^\s+([\d,]+)\s+\d+ MiB\s+([\d.]+)\s+([\d.]+)\s", out, re.M)
    return {f"report {int(n.replace(',', '')):,} events (s)": float(t) for n, t, _ in rows}


def _parse_figures(out: str) -> dict[str, float]:
    parse = re.search(r"tpudiag parse_hlo_text\s+(\d+) ms", out)
    xla = re.search(r"XLA hlo_module_from_text\s+(\d+) ms", out)
    diff = re.search(r"^\s+([\d.]+) s wall, [\d.]+ s CPU; all runs", out, re.M)
    return {"HLO parse (ms)": float(parse[1]), "XLA parse, the peer (ms)": float(xla[1]),
            "hlo diff 15 vs 16 layers (s)": float(diff[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare the working tree against")
    ap.add_argument("--head", default=None, help="a commit to measure instead of the working tree")
    ap.add_argument("--keep", type=Path, default=None, help="reuse (or keep) trace_throughput's traces here")
    ap.add_argument("--rounds", type=int, default=2, help="base/working-tree alternations; best is kept")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpudiag-base-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        _export(args.base, base)
        keep = args.keep or Path(tmp) / "traces"
        head = REPO
        if args.head:
            head = Path(tmp) / "head"
            head.mkdir()
            _export(args.head, head)
        trees = {f"base {args.base}": base, f"head {args.head}" if args.head else "working tree": head}
        best: dict[str, dict[str, float]] = {name: {} for name in trees}
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                print(f"round {r + 1}: {name} ...", flush=True)
                figures = {**_trace_figures(_run("trace_throughput.py", tree, ["--keep", str(keep)])),
                           **_parse_figures(_run("hlo_parse.py", tree, []))}
                for k, v in figures.items():
                    best[name][k] = min(v, best[name].get(k, v))
    (bname, b), (wname, w) = best.items()
    print(f"\nbest of {args.rounds} rounds per figure\n")
    print(f"  {'figure':38s} {bname:>14s} {wname:>14s}  ratio")
    for k in b:
        print(f"  {k:38s} {b[k]:14.3f} {w[k]:14.3f}  {w[k] / b[k]:.3f}x")
    print("\ngoals")
    for k in b:
        if "peer" in k:
            continue
        ratio = w[k] / b[k]
        print(f"  {k}: working tree / base <= {GOAL:.2f}x: {ratio:.3f}x  {'MET' if ratio <= GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
