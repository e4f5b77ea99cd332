"""Compile scaling: where the time of `tpudiag compile` goes as a decoder stack grows.

It runs `tpudiag compile --target v5e --json --out RUN fixtures/programs/decoder.py -- --layers N
--steps 1` for N = 2, 4, 8, 16 (each a subprocess, JAX_PLATFORMS=cpu, `--timeout` bounding each
module's static-profile attempt), and once more at 16 layers with `--no-static-profile`. For each
run it reports:
- total: the wall time of the whole `tpudiag compile` subprocess;
- shadow: `wall_s` in RUN/shadow/manifest.json (the program's CPU run that dumps its JAX IR);
- compile phase: first module's spec.json to last module's module.json (file mtimes);
- compiler: the sum over modules of `compile_s` in result.json (time inside the TPU compiler's
  compile call; modules run `--jobs` at once, so this can exceed the compile phase);
- worker overhead: per module, module wall (spec.json to module.json) minus compile_s, summed
  over the modules that kept their first attempt (process start, imports, topology set-up,
  writing the optimized HLO); modules whose static profile was dropped are counted apart as
  `dropped` (their wall minus compile_s: the killed attempt plus the retry's overhead);
- in-run analysis: report.json's mtime minus the last module.json's (parse, analyze, write);
- report: `tpudiag report --json RUN` in a subprocess (best of `--repeat`) minus the CLI's
  start-up (`tpudiag --help`, best of `--repeat`);
- analyze: `tpudiag.api.analyze_compile_run(RUN)` in this process (best of `--repeat`, imports
  done beforehand), split into parse (each module's optimized HLO, LLO dump and static profile)
  and build (the report itself);
- sizes: run directory MiB, the parsed inputs' MiB (optimized.hlo.txt, llo/ without the HTML
  VMEM reports, static_profile/), the largest optimized.hlo.txt, modules and ops (rows of the
  report, `totals.ops` summed over modules).

Goal: tpudiag's own share, parsing and analysis (`analyze` above), under 20% of
the total wall time at every size, and growing linearly with the layers: analyze at 16 layers
<= 2.2x analyze at 8 layers. Prints tables, the goals, and the top functions of a cProfile of
`tpudiag report --json RUN` on the largest static-profile run; never asserts.

    python bench/compile_scaling.py [--layers 2 4 8 16] [--timeout 60] [--repeat 3] [--keep DIR]

With `--cache`, it measures the compile cache and the static-profile budget instead:
- cold and warm: the 16-layer decoder's `tpudiag compile --target v5e` with an empty cache
  directory, then again with the same one (goal: warm at least 10x faster; the estimates identical);
- beside: the one-layer decoder's `tpudiag compile --target v5e` at the default settings, with no
  cache, while a second `tpudiag compile` (the 16-layer decoder, static profile on, no cache) runs
  beside it on the same machine (goal: its main module, jit_train_step, keeps its static profile).

    python bench/compile_scaling.py --cache [--keep DIR]

With `--script [SCRIPT ARGS...]`, it measures what a script's compile costs against its largest
module alone, in one run: the script compiled with every module (`--each-module`: each in its own
worker with the static profile), with the defaults (setup modules left out of the compile), and the
largest module the defaults compiled (a setup module is never the peer), its input.mlir alone; with
`--before-tree DIR` also with an earlier tree's defaults (a copy of it, first on PYTHONPATH). It
prints the ratios (goal: the defaults <= 1.3x alone) and each module's static-profile outcome and
wall seconds in each run.

    python bench/compile_scaling.py [--jobs 2] [--before-tree DIR] --script [fixtures/programs/qwen_block.py --forward]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "fixtures" / "programs" / "decoder.py"
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
GOAL_SHARE = 0.20
GOAL_DOUBLING = 2.2


def run(cmd: list[str], stdout=subprocess.DEVNULL, env: dict | None = None, cwd: Path = REPO) -> float:
    """Wall seconds of one subprocess run; stops the benchmark if the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env or ENV, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode()[-2000:]}")
    return wall


def best(fn, repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def _mib(paths) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def module_stats(run_dir: Path) -> dict:
    """Per-module timings from result.json, module.json and file mtimes; sizes of what is parsed."""
    mdirs = sorted(p for p in (run_dir / "modules").iterdir() if (p / "module.json").is_file())
    compile_s = overhead = dropped = 0.0
    n_dropped, starts, ends, hlo_sizes, parsed = 0, [], [], [], []
    for d in mdirs:
        meta = json.loads((d / "module.json").read_text())
        result = json.loads((d / "result.json").read_text()) if meta["status"] == "ok" else {}
        start, end = (d / "spec.json").stat().st_mtime, (d / "module.json").stat().st_mtime
        starts.append(start)
        ends.append(end)
        c = result.get("compile_s", 0.0)
        compile_s += c
        if meta["static_profile"].startswith("dropped"):
            n_dropped += 1
            dropped += (end - start) - c
        else:
            overhead += (end - start) - c
        hlo = d / "optimized.hlo.txt"
        if hlo.is_file():
            hlo_sizes.append((hlo.stat().st_size, meta["name"]))
            parsed.append(hlo)
        parsed += [p for p in (d / "llo").glob("*") if p.suffix != ".html"] if (d / "llo").is_dir() else []
        parsed += list((d / "static_profile").glob("*")) if (d / "static_profile").is_dir() else []
    return {"modules": len(mdirs), "compile_s": compile_s, "overhead": overhead, "dropped": dropped,
            "n_dropped": n_dropped, "phase": max(ends) - min(starts) if mdirs else 0.0,
            "last_end": max(ends, default=0.0),
            "largest_hlo": max(hlo_sizes, default=(0, "-")), "parsed_mib": _mib(parsed),
            "run_mib": _mib(run_dir.rglob("*"))}


def analyze_in_process(run_dir: Path, repeat: int) -> dict:
    """Best-of-`repeat` seconds of analyze_compile_run, and of its two halves (parse, build)."""
    from tpudiag import api
    from tpudiag.analyze.compile.report import build_compile_report
    from tpudiag.capture.tpu_compile import load_module
    from tpudiag.targets import resolve_target

    def whole():
        t0 = time.perf_counter()
        api.analyze_compile_run(run_dir)
        return time.perf_counter() - t0

    # The same steps as analyze_compile_run, timed apart (`module_artifacts` is its parse step).
    manifest = json.loads((run_dir / "manifest.json").read_text())
    target = resolve_target(manifest["target"]["topology"])
    mdirs = sorted(p for p in (run_dir / "modules").iterdir() if (p / "module.json").is_file())
    parse_t, build_t = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        arts = [api.module_artifacts(load_module(d)) for d in mdirs]
        t1 = time.perf_counter()
        build_compile_report(target, arts, manifest.get("source", {}))
        parse_t.append(t1 - t0)
        build_t.append(time.perf_counter() - t1)
    return {"analyze": best(whole, repeat), "parse": min(parse_t), "build": min(build_t)}


def measure(layers: int, static: bool, args, root: Path, startup: float) -> dict:
    out = root / f"decoder-{layers}{'' if static else '-nostatic'}"
    cmd = [*TPUDIAG, "compile", "--target", "v5e", "--json", "--out", str(out), "--timeout", str(args.timeout),
           "--jobs", str(args.jobs), *([] if static else ["--no-static-profile"]), str(PROGRAM), "--",
           "--layers", str(layers), "--steps", "1"]
    print(f"compiling {layers} layers{'' if static else ' --no-static-profile'} ...", flush=True)
    total = run(cmd)
    shadow = json.loads((out / "shadow" / "manifest.json").read_text())["wall_s"]
    report_doc = json.loads((out / "report.json").read_text())
    ms = module_stats(out)
    report = best(lambda: run([*TPUDIAG, "report", "--json", str(out)]), args.repeat) - startup
    inproc = analyze_in_process(out, args.repeat)
    ok = [m for m in report_doc["modules"] if m["totals"]]
    return {"layers": layers, "static": static, "run_dir": out, "total": total, "shadow": shadow, **ms,
            "in_run": (out / "report.json").stat().st_mtime - ms["last_end"], "report": report, **inproc,
            "ops": sum(m["totals"]["ops"] for m in ok),
            "static_ops": sum(m["totals"]["ops_with_static_cycles"] for m in ok),
            "statuses": [m["static_profile"] for m in report_doc["modules"]]}


def hot_spots(run_dir: Path, root: Path, top: int) -> list[str]:
    """cProfile of `python -m tpudiag report --json RUN`: top functions by own time, and tpudiag's by cumulative."""
    prof = root / "report.prof"
    run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "tpudiag", "report", "--json", str(run_dir)])
    stats = pstats.Stats(str(prof)).stats  # {(file, line, name): (cc, ncalls, tottime, cumtime, callers)}
    total = max(v[3] for v in stats.values())

    def where(key):
        file, line, name = key
        if file == "~":
            return name
        parts = Path(file).parts
        short = "/".join(parts[parts.index("tpudiag"):]) if "tpudiag" in parts else "/".join(parts[-2:])
        return f"{short}:{line}({name})"

    lines = [f"cProfile of `tpudiag report --json` on {run_dir.name}: {total:.2f} s under the profiler",
             f"  {'own s':>7} {'cum s':>7} {'calls':>9}  function (top {top} by own time)"]
    for key, (_, nc, tt, ct, _) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"  {tt:>7.2f} {ct:>7.2f} {nc:>9}  {where(key)}")
    lines.append(f"  {'own s':>7} {'cum s':>7} {'calls':>9}  tpudiag function (top {top} by cumulative time)")
    ours = [(k, v) for k, v in stats.items() if "/tpudiag/" in k[0] and "cli.py" not in k[0]
            and "__main__" not in k[0]]
    for key, (_, nc, tt, ct, _) in sorted(ours, key=lambda kv: -kv[1][3])[:top]:
        lines.append(f"  {tt:>7.2f} {ct:>7.2f} {nc:>9}  {where(key)}")
    return lines


def _compile_cmd(out: Path, layers: int, *opts: str) -> list[str]:
    return [*TPUDIAG, "compile", "--target", "v5e", "--json", *opts, "--out", str(out), str(PROGRAM), "--",
            "--layers", str(layers), "--steps", "1"]


def _estimates(run_dir: Path) -> list:
    doc = json.loads((run_dir / "report.json").read_text())
    return [(m["name"], m["static_profile"], m["totals"].get("estimated_s")) for m in doc["modules"]]


def cache_and_budget(root: Path, layers: int = 16) -> None:
    """The `--cache` measurements (module docstring), printed with their goals."""
    cache = root / "cache"
    cold = run(_compile_cmd(root / "cold", layers, "--cache-dir", str(cache)))
    warm = run(_compile_cmd(root / "warm", layers, "--cache-dir", str(cache)))
    same = _estimates(root / "cold") == _estimates(root / "warm")
    shadow = [json.loads((root / r / "shadow" / "manifest.json").read_text())["wall_s"] for r in ("cold", "warm")]

    other = subprocess.Popen(_compile_cmd(root / "other", 16, "--no-cache"), env=ENV, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)  # the other compile is past its shadow run and into its modules
        beside = run(_compile_cmd(root / "beside", 1, "--no-cache"))
        other_busy = other.poll() is None
    finally:
        other.kill()
        other.wait()
    mods = {json.loads((d / "module.json").read_text())["name"]: (d, json.loads((d / "module.json").read_text()))
            for d in sorted((root / "beside" / "modules").iterdir())}
    d, step = mods["jit_train_step"]
    step_s = json.loads((d / "result.json").read_text()).get("compile_s")

    print(f"\n{datetime.now():%Y-%m-%d %H:%M}; `tpudiag compile --target v5e` of decoder.py --steps 1, default limits\n")
    print(f"{'run':<34} {'wall s':>7} {'shadow s':>8}  static profile per module")
    for label, wall, sh, r in ((f"{layers} layers, empty cache (cold)", cold, shadow[0], "cold"),
                               (f"{layers} layers, same cache (warm)", warm, shadow[1], "warm")):
        print(f"{label:<34} {wall:>7.1f} {sh:>8.1f}  {', '.join(str(e[1]) for e in _estimates(root / r))}")
    statuses = ", ".join(f"{n}: {m['static_profile']} (limit {m.get('static_limit_s')} s CPU)"
                         for n, (_, m) in mods.items())
    print(f"{'1 layer, no cache, beside another':<34} {beside:>7.1f} {'':>8}  {statuses}")
    print(f"\n  the other compile (16 layers, static profile, no cache) was {'still' if other_busy else 'no longer'} "
          f"running when the one-layer compile ended; jit_train_step compile_s {step_s} s")
    print("\ngoals")
    ratio = cold / warm
    print(f"  warm cache at least 10x faster than cold: {ratio:.1f}x  {'MET' if ratio >= 10 else 'MISSED'}")
    print(f"  estimates identical cold and warm: {same}  {'MET' if same else 'MISSED'}")
    kept = step["static_profile"] == "ok" and other_busy
    print(f"  decoder block's jit_train_step keeps its static profile beside another compile: "
          f"{step['static_profile']}  {'MET' if kept else 'MISSED'}")


def _per_module(run_dir: Path) -> dict[str, dict]:
    """{module directory: its setup flag, static-profile outcome and limit, and wall seconds (spec.json
    to module.json: its worker, or its share of the setup group's)}."""
    rows = {}
    for d in sorted(p for p in (run_dir / "modules").iterdir() if (p / "module.json").is_file()):
        meta = json.loads((d / "module.json").read_text())
        rows[d.name] = {"setup": bool(meta.get("setup")), "static": meta["static_profile"],
                        "limit": meta.get("static_limit_s"),
                        "wall": (d / "module.json").stat().st_mtime - (d / "spec.json").stat().st_mtime}
    return rows


def _label(row: dict | None) -> str:
    if row is None:
        return "left out (setup)"
    return "setup group (no static profile)" if row["setup"] else row["static"]


def script_scaling(root: Path, program: list[str], jobs: int, before_tree: Path | None = None) -> None:
    """A script compiled three or four ways, one after another: with `before_tree`, that tree's
    defaults (its `tpudiag` first on PYTHONPATH); every module (`--each-module`: each in its own
    worker with the static profile); this tree's defaults (setup modules left out); and the
    largest module those defaults compiled, alone (its input.mlir given to `tpudiag compile`).
    Goal: the defaults cost at most 1.3x that module alone."""
    base = [*TPUDIAG, "compile", "--target", "v5e", "--no-cache", "--json", "--jobs", str(jobs)]
    each, after, alone = root / "each", root / "after", root / "alone"
    runs = []
    if before_tree:
        # Run from the earlier tree: `python -m` puts the working directory first on sys.path, ahead
        # of this checkout's editable install, for tpudiag and for the workers it starts.
        old_env = {**ENV, "PYTHONPATH": str(before_tree.resolve())}
        script = [str(Path(program[0]).resolve()), *program[1:]]
        runs.append((f"before: the defaults of {before_tree.name}", root / "before",
                     run([sys.executable, "-m", "tpudiag", *base[len(TPUDIAG):], "--out", str(root.resolve() / "before"),
                          *script], env=old_env, cwd=before_tree)))
    runs.append(("every module: --each-module", each, run([*base, "--each-module", "--out", str(each), *program])))
    runs.append(("after: the defaults", after, run([*base, "--out", str(after), *program])))
    largest = max((after / "modules").iterdir(), key=lambda d: (d / "input.mlir").stat().st_size)
    t_alone = run([*base, "--out", str(alone), str(largest / "input.mlir")])
    runs.append((f"largest module alone ({largest.name})", alone, t_alone))
    print(f"\n{datetime.now():%Y-%m-%d %H:%M}; `tpudiag compile --target v5e --no-cache --jobs {jobs}` of "
          f"{' '.join(Path(program[0]).name if i == 0 else a for i, a in enumerate(program))}; wall seconds\n")
    print(f"{'run':<44} {'total':>7} {'shadow':>7} {'/ alone':>8}")
    for label, out, t in runs:
        shadow = out / "shadow" / "manifest.json"
        sh = f"{json.loads(shadow.read_text())['wall_s']:>7.1f}" if shadow.is_file() else f"{'-':>7}"
        print(f"{label:<44} {t:>7.1f} {sh} {t / t_alone:>7.2f}x")
    t_after = runs[-2][2]
    print(f"goal: after <= 1.3x alone: {'met' if t_after <= 1.3 * t_alone else 'NOT met'} ({t_after / t_alone:.2f}x)")
    cols = [(label.split(":")[0], _per_module(out)) for label, out, _ in runs[:-1]]
    print(f"\n{'module':<28} " + " | ".join(f"{name + ': static profile':<40} {'wall':>6}" for name, _ in cols))
    for mdir in cols[-2][1]:  # --each-module compiles every module
        cells = []
        for _, rows in cols:
            row = rows.get(mdir)
            cells.append(f"{_label(row)[:40]:<40} {row['wall'] if row else 0.0:>6.1f}")
        print(f"{mdir[:28]:<28} " + " | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16], help="decoder sizes")
    parser.add_argument("--no-static-layers", type=int, default=16,
                        help="also run this size with --no-static-profile (0: skip)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="`tpudiag compile --timeout`: seconds a module's static-profile attempt may take")
    parser.add_argument("--jobs", type=int, default=2, help="`tpudiag compile --jobs`")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each report/analysis timing (best kept)")
    parser.add_argument("--top", type=int, default=12, help="functions listed from the cProfile")
    parser.add_argument("--keep", type=Path, help="write the runs here and keep them (default: a temp dir, removed)")
    parser.add_argument("--cache", action="store_true",
                        help="measure the compile cache (cold, warm) and the static-profile budget instead")
    parser.add_argument("--before-tree", type=Path,
                        help="with --script: also compile the script with this copy of an earlier tree's tpudiag "
                             "(first on PYTHONPATH), at its defaults")
    parser.add_argument("--script", nargs=argparse.REMAINDER,
                        help="measure a script compiled before/after/largest-module-alone instead (the rest of "
                             "the line: the script and its arguments; default fixtures/programs/qwen_block.py "
                             "--forward)")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    if args.script is not None:
        try:
            script_scaling(root, args.script or [str(REPO / "fixtures" / "programs" / "qwen_block.py"), "--forward"],
                           args.jobs, args.before_tree)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        print(f"\nbenchmark wall: {time.perf_counter() - t_start:.0f} s")
        return
    if args.cache:
        try:
            cache_and_budget(root)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        print(f"\nbenchmark wall: {time.perf_counter() - t_start:.0f} s")
        return
    try:
        startup = best(lambda: run([*TPUDIAG, "--help"]), args.repeat)
        t0 = time.perf_counter()
        import tpudiag.analyze.compile.report  # noqa: F401 - the in-process timings exclude imports
        import tpudiag.api  # noqa: F401
        import tpudiag.capture.tpu_compile  # noqa: F401
        import tpudiag.parse.llo  # noqa: F401
        imports = time.perf_counter() - t0
        configs = [(n, True) for n in args.layers]
        if args.no_static_layers:
            configs.append((args.no_static_layers, False))
        results = [measure(n, static, args, root, startup) for n, static in configs]
        static_runs = [r for r in results if r["static"]]
        profile = hot_spots(max(static_runs, key=lambda r: r["layers"])["run_dir"], root, args.top) \
            if static_runs else []
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    bench_wall = time.perf_counter() - t_start

    print(f"\n{datetime.now():%Y-%m-%d %H:%M}; `tpudiag compile --target v5e --timeout {args.timeout:g} "
          f"--jobs {args.jobs}` of decoder.py --layers N --steps 1; seconds\n")
    print(f"{'layers':<12} {'total':>6} {'shadow':>6} {'phase':>6} {'compiler':>8} {'w.ovh':>6} {'dropped':>8} "
          f"{'in-run':>6} | {'report':>6} {'analyze':>7} {'parse':>6} {'build':>6} {'share':>6} {'/layer':>7}")
    for r in results:
        label = f"{r['layers']}{'' if r['static'] else ' nostatic'}"
        dropped = f"{r['dropped']:.1f} ({r['n_dropped']})" if r["n_dropped"] else "-"
        print(f"{label:<12} {r['total']:>6.1f} {r['shadow']:>6.1f} {r['phase']:>6.1f} {r['compile_s']:>8.1f} "
              f"{r['overhead']:>6.1f} {dropped:>8} {r['in_run']:>6.2f} | {r['report']:>6.2f} {r['analyze']:>7.2f} "
              f"{r['parse']:>6.2f} {r['build']:>6.2f} {r['analyze'] / r['total']:>6.1%} "
              f"{r['analyze'] / r['layers']:>7.3f}")
    print(f"\n{'layers':<12} {'modules':>7} {'ops':>6} {'static ops':>10} {'run dir':>9} {'parsed':>9} "
          f"{'largest optimized.hlo.txt':>32}  static profile per module")
    for r in results:
        label = f"{r['layers']}{'' if r['static'] else ' nostatic'}"
        size, name = r["largest_hlo"]
        print(f"{label:<12} {r['modules']:>7} {r['ops']:>6} {r['static_ops']:>10} {r['run_mib']:>5.1f} MiB "
              f"{r['parsed_mib']:>5.1f} MiB {size / 1024:>10.0f} KiB ({name:>17})  "
              f"{', '.join(s.removeprefix('dropped: ') for s in r['statuses'])}")
    print("\n  total = the `tpudiag compile` subprocess; shadow = the program's CPU run (shadow/manifest.json wall_s);"
          "\n  phase = first spec.json to last module.json; compiler = sum of result.json compile_s (jobs overlap);"
          "\n  w.ovh = sum of (module wall - compile_s) over modules that kept their first attempt;"
          "\n  dropped = sum of (module wall - compile_s) over modules whose static profile was dropped (count);"
          "\n  in-run = report.json mtime - last module.json mtime (parse + analyze + write, inside compile);"
          f"\n  report = `tpudiag report --json RUN` - CLI start-up ({startup:.2f} s, `tpudiag --help`);"
          f"\n  analyze = api.analyze_compile_run in-process (imports done first, {imports:.2f} s) = parse + build;"
          "\n  share = analyze / total; /layer = analyze / layers;"
          "\n  parsed = optimized.hlo.txt + llo/ (without .html) + static_profile/")
    if profile:
        print()
        print("\n".join(profile))

    print("\ngoals")
    for r in results:
        share = r["analyze"] / r["total"]
        label = f"{r['layers']} layers{'' if r['static'] else ' --no-static-profile'}"
        verdict = "MET" if share < GOAL_SHARE else "MISSED"
        print(f"  {label}: analyze / total < {GOAL_SHARE:.0%}: {share:.1%}  {verdict}")
    by_layers = {r["layers"]: r for r in static_runs}
    top = max(by_layers, default=None)
    if top and top // 2 in by_layers:
        ratio = by_layers[top]["analyze"] / by_layers[top // 2]["analyze"]
        print(f"  linear: analyze at {top} layers / at {top // 2} <= {GOAL_DOUBLING}x: {ratio:.2f}x  "
              f"{'MET' if ratio <= GOAL_DOUBLING else 'MISSED'}")
    print(f"\nbenchmark wall: {bench_wall:.0f} s")


if __name__ == "__main__":
    main()
