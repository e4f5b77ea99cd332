"""What the block-size sweeps (bench/sweep_*.py) share.

`measure` AOT-compiles a function for a TPU target on this CPU machine (`tpudiag.compile`, one compile at a
time, in tpudiag's worker process) and sums the corrected cycles over the compiled module's ops exactly as
`tpudiag kernels bench` does (tpudiag.analyze.compile.kernel_bench.op_corrected_cycles): per op its compile-report
time at the clock, the largest of the static estimated cycles, the HBM floor (bytes_accessed / HBM bytes per
second x clock) and the compute floor (FLOPs at the bf16 peak x clock); an op the static profile did not
estimate counts at the larger of its two floors. A Pallas call's bytes and FLOPs come from its pl.CostEstimate. `Sweep` runs one compile after another
into run directories under one folder, keeps the results and prints a line after each; `print_table` prints
them; `add_sweep_args` adds the options most sweeps take. The rest serves the two families of sweeps that are
the same apart from their kernel: one labelled line per compile (cross-entropy, sampling) and
fwd / training-step modes over a kernel module's bench setups (RMSNorm, RoPE). `bench_specs` runs
`tpudiag kernels bench` on specs whose setups carry a peer (the benches against other libraries).

The scripts run as `python bench/sweep_X.py`, so this folder is sys.path[0] and they import `sweep_common`.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import tempfile
import time
from pathlib import Path

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu's lock

# Longer than the CLI's 60 s static-profile limit: on a shared 2-core machine a kernel's profile can take
# over a minute, and a dropped profile leaves only the floors.
STATIC_TIMEOUT_S = 240.0


def _error_text(e: Exception, width: int = 110) -> str:
    text = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {text if len(text) <= width else '...' + text[-width:]}"


def measure(fn, args, target: str, out_dir, static_profile: bool = True, timeout_s: float | None = None,
            memory_gib: float | None = None, fresh: bool = False) -> dict:
    """Compile fn(*args) for target into the run directory out_dir and return its figures:

    status "ok", "failed" (a module did not compile) or "error" (lowering or compiling raised: e.g. block
    sizes the kernel refuses), with `error`; `corrected` (sum of op_corrected_cycles, unrounded; None
    unless ok), `static` (sum of the static estimates; None where the compiler gave none), `static_kernel`
    (the custom calls' static estimates), `ops`, `ops_floor_only` (ops with no static estimate), `bound`
    (ops per op_corrected_cycles' "how"), `bytes`, `mb`, `flops`, `static_profiles` (per module: "ok",
    "off" or why it was dropped), `sources` (the ops' cycles sources joined with "+"), `op_rows` (per op:
    name, opcode, static, hbm, compute, cycles, how) and `wall_s`.

    timeout_s / memory_gib: the static profile's time and memory limits (None: tpudiag's defaults).
    fresh: remove out_dir first (tpudiag never reuses a non-empty run directory).
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    if fresh:
        shutil.rmtree(out_dir, ignore_errors=True)
    r = {"target": target, "run_dir": str(out_dir), "status": "error", "error": None, "corrected": None,
         "static": None, "static_kernel": 0, "ops": 0, "ops_floor_only": 0, "bound": {}, "bytes": 0, "mb": 0.0,
         "flops": 0, "static_profiles": [], "sources": "", "op_rows": [], "wall_s": 0.0}
    try:
        import tpudiag
        from tpudiag.capture.tpu_compile import Limits

        # every loop iteration stepped through, as `kernels tune` does: fast-forwarded loops inflate a
        # gridded kernel's cycles (api/tune.py)
        limits = {"fast_forward": False}
        if timeout_s is not None:
            limits["static_timeout_s"] = timeout_s
        if memory_gib is not None:
            limits["memory_bytes"] = int(memory_gib * 2**30)
        res = tpudiag.compile(fn, *args, target=target, out=out_dir, static_profile=static_profile, jobs=1,
                              limits=Limits(**limits))
        report = res.report
    except Exception as e:  # report it and let the sweep go on
        r.update(error=_error_text(e), wall_s=time.perf_counter() - t0)
        return r
    from tpudiag.analyze.compile.kernel_bench import op_corrected_cycles

    t = report.target
    clock, bw, peak = t.clock_hz, t.hbm_bytes_per_s, t.peak_bf16_flops_per_s
    corrected, sources, errors = 0.0, set(), []
    for m in report.modules:
        r["static_profiles"].append(str(m.static_profile))
        if m.status != "ok":
            errors.append(m.error or f"module {m.status}")
            continue
        for o in m.ops:
            cycles, how = op_corrected_cycles(o, clock)
            static = o.estimated_cycles
            corrected += cycles
            r["bound"][how] = r["bound"].get(how, 0) + 1
            r["ops"] += 1
            r["ops_floor_only"] += how == "roofline"
            r["bytes"] += o.bytes_accessed
            r["flops"] += o.flops
            sources.add(o.cycles_source or "?")
            if static:
                r["static"] = (r["static"] or 0) + static
                if o.opcode == "custom-call":
                    r["static_kernel"] += static
            r["op_rows"].append({"name": o.name, "opcode": o.opcode, "static": static,
                                 "hbm": o.bytes_accessed / bw * clock, "compute": o.flops / peak * clock,
                                 "cycles": cycles, "how": how})
    ok = bool(report.modules) and not errors
    r.update(status="ok" if ok else "failed", error=None if ok else "; ".join(errors) or "no module",
             corrected=corrected if ok else None, mb=r["bytes"] / 1e6, sources="+".join(sorted(sources)),
             wall_s=time.perf_counter() - t0)
    return r


def floor_note(r: dict) -> str:
    """"" for a clean result; else why the figure is missing or partly roofline floors."""
    note = "" if r["status"] == "ok" else f" FAILED: {r['error']}"
    if r["ops_floor_only"]:
        note += (f" ({r['ops_floor_only']} ops at their roofline floor; "
                 f"static profile: {','.join(r['static_profiles'])[:60]})")
    return note


def bound_note(r: dict, min_share: float | None = None) -> str:
    """Dropped static profiles, each custom call (and each op over min_share of the total) with its static
    estimate and what bound it, then the ops per bound."""
    if r["status"] != "ok":
        return f"{'module failed' if r['status'] == 'failed' else 'error'}: {(r['error'] or '')[:120]}"
    notes = [f"static profile: {p[:50]}" for p in r["static_profiles"] if p != "ok"]
    for o in r["op_rows"]:
        if o["opcode"] == "custom-call" or (min_share is not None and o["cycles"] > min_share * r["corrected"]):
            notes.append(f"{o['name']}: static {o['static']} -> {o['cycles']:.0f} ({o['how']})")
    notes.append("ops by bound: " + ", ".join(f"{k} {v}" for k, v in sorted(r["bound"].items())))
    return "; ".join(notes)


class Sweep:
    """Compiles variants one after another into run directories under `out`, keeps each result (with the
    caller's own fields added) in `rows`, and prints `line(result)` after each compile."""

    def __init__(self, out, line=None, **measure_kw):
        self.out, self.line, self.measure_kw, self.rows = Path(out), line, measure_kw, []

    def __call__(self, fn, args, target: str, tag: str | None = None, **fields) -> dict:
        """Measure fn(*args) for target in out/tag (default: "<target>-<number of rows so far>")."""
        r = measure(fn, args, target, self.out / (tag or f"{target}-{len(self.rows)}"), **self.measure_kw)
        r.update(fields)
        self.rows.append(r)
        if self.line:
            print(self.line(r), flush=True)
        return r


_SPEC = re.compile(r"(?P<align>.?[<>=^])?[+\- ]?z?#?0?(?P<width>\d*)(?P<group>[,_])?(?:\.\d+)?(?P<type>[a-zA-Z%])?$")


def _plain_spec(spec: str) -> str:
    """The alignment and width of a field's format spec, for its title and for a missing value: numbers
    right-aligned unless the spec says otherwise."""
    m = _SPEC.match(spec)
    if not m:
        return ""
    numeric = bool(m["group"]) or (m["type"] or "s") in "bcdeEfFgGnoxX%"
    align = m["align"][-1] if m["align"] else (">" if numeric else "<")
    return f"{'>' if align == '=' else align}{m['width']}"


def format_row(fmt: str, row: dict, titles: dict | None = None) -> str:
    """fmt (a str.format template of named fields, "{target:6} {cycles:16,.0f}") filled from row; a None
    value prints as "-". With titles, the header instead: each field's title (default: its name) at the
    field's width and alignment."""
    parts = []
    for literal, name, spec, _ in string.Formatter().parse(fmt):
        parts.append(literal)
        if name is None:
            continue
        if titles is not None:
            parts.append(format(titles.get(name, name), _plain_spec(spec)))
        elif row[name] is None:
            parts.append(format("-", _plain_spec(spec)))
        else:
            parts.append(format(row[name], spec))
    return "".join(parts)


def print_table(fmt: str, rows, titles: dict | None = None) -> None:
    """A header line and one line per row (dicts) in fmt; see format_row."""
    print(format_row(fmt, {}, titles or {}))
    for row in rows:
        print(format_row(fmt, row))


def add_sweep_args(ap, *, static_timeout: float = STATIC_TIMEOUT_S, timeout_help: str | None = None, out=None,
                   out_help: str | None = "run directories go here (default: a fresh temporary folder)"):
    """--targets (the first is swept, the rest get the chosen blocks), --static-timeout and --out."""
    ap.add_argument("--targets", nargs="+", default=["v5e", "v6e"])
    ap.add_argument("--static-timeout", type=float, default=static_timeout, help=timeout_help)
    ap.add_argument("--out", default=out, help=out_help)


def target_or_none(text: str, prog: str):
    """The `Target` a bench's --target names, or None after one line on stderr saying why not (the
    caller exits 2)."""
    import sys

    from tpudiag.errors import InputError
    from tpudiag.targets import resolve_target

    try:
        return resolve_target(text)
    except InputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def run_root(out, prefix: str) -> Path:
    """out, or a fresh temporary folder named prefix...; created."""
    path = Path(out) if out else Path(tempfile.mkdtemp(prefix=prefix))
    path.mkdir(parents=True, exist_ok=True)
    return path


def rounded(cycles):
    """Cycles as a whole number for a progress line, "-" where there are none."""
    return "-" if cycles is None else round(cycles)


def print_ratio(kernel, xla) -> None:
    if kernel and xla:
        print(f"     ratio kernel/xla = {kernel / xla:.3f}", flush=True)


def tune_blocks(kernel: str, target: str, out, static_timeout_s: float = STATIC_TIMEOUT_S) -> list[dict]:
    """A bundled kernel's block candidates on `target` through `tpudiag kernels tune KERNEL`
    (api.kernels_tune: the command's lowering, compiles, ranking and run directory, every grid step
    stepped through), at the kernel's production shape. Prints the tune's table (Markdown) and
    returns one row per candidate: `blocks` (its choice as text), `corrected` (None where it did not
    compile), `status`, `rank`, `chosen` (the kernel's own blocks) and `error`."""
    from tpudiag.api.tune import kernels_tune
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.report.registry import render

    result, run = kernels_tune(kernel, target, None, None, Path(out), jobs=1,
                               limits=Limits(static_timeout_s=static_timeout_s))
    print(render(result, "md"), flush=True)
    return [{"blocks": " ".join(f"{k}={v}" for k, v in p.choice.items()), "corrected": p.corrected_cycles,
             "status": p.status, "rank": p.rank, "chosen": p.choice == result.default, "error": p.error,
             "mb": p.bytes_accessed / 1e6, "target": target} for p in result.points]


# Sweeps with one label per compile (cross-entropy, sampling).

class LabelledSweep(Sweep):
    """Fresh run directories <out>/<target>-<n>; after each compile a line: target, label, corrected
    cycles, MB, seconds and floor_note."""

    def __init__(self, out, width: int, static_timeout_s: float):
        super().__init__(out, line=self._line, timeout_s=static_timeout_s, fresh=True)
        self.width = width

    def _line(self, r: dict) -> str:
        return (f"{r['target']:4} {r['label']:{self.width}} {r['corrected'] or 0:12,.0f} cycles {r['mb']:8.1f} MB "
                f"{r['wall_s']:5.0f} s{floor_note(r)}")

    def measure(self, target: str, label: str, fn, args):
        """Corrected cycles of fn(*args) on target (None if it did not compile)."""
        return self(fn, args, target, label=label)["corrected"]

    def print_table(self) -> None:
        print()
        print_table(f"{{target:7}} {{label:{self.width}}} {{corrected:16,.0f}} {{mb:8.1f}}{{note}}",
                    [dict(r, corrected=r["corrected"] or 0, note=floor_note(r)) for r in self.rows],
                    {"label": "what", "corrected": "corrected cycles", "mb": "MB", "note": ""})


# Sweeps over a kernel module's bench setups, forward and training step (RMSNorm, RoPE).

def add_mode_args(ap) -> None:
    """add_sweep_args, --mode fwd|step|both and --default-only."""
    add_sweep_args(ap)
    ap.add_argument("--mode", choices=("fwd", "step", "both"), default="fwd")
    ap.add_argument("--default-only", action="store_true", help="compile only the default blocks (and XLA)")


def run_modes(a, prefix: str, kernel, step, step_args, title: str) -> int:
    """Per mode (a.mode: "fwd", "step": step(f) over step_args(args), or "both") and target: the plain-JAX
    version, then the kernel at each of kernel.SPEC.block_candidates on the first target (unless
    a.default_only; the forward's through `tpudiag kernels tune`, tune_blocks) and at kernel.DEFAULT_BLOCKS
    on the others; then title and the table, with each kernel's ratio to the plain-JAX version of its
    mode. Run directories under a.out or a fresh prefix... folder."""
    out = run_root(a.out, prefix)
    sw = Sweep(out, line=_mode_line, timeout_s=a.static_timeout)
    modes = []
    if a.mode in ("fwd", "both"):
        modes.append(("fwd", lambda f: f, lambda args: args))
    if a.mode in ("step", "both"):
        modes.append(("step", step, step_args))
    for m, wrap, wargs in modes:
        for ti, target in enumerate(a.targets):
            base = kernel.bench()
            sw(wrap(base.xla), wargs(base.args), target, f"{target}-{m}-xla", mode=m, what="xla", blocks="")
            sweep = ti == 0 and not a.default_only
            if sweep and m == "fwd":
                for r in tune_blocks(kernel.SPEC.name, target, out / f"{target}-{m}-tune", a.static_timeout):
                    sw.rows.append({"target": target, "mode": m, "what": "kernel", "blocks": r["blocks"],
                                    "corrected": r["corrected"], "status": "ok" if r["corrected"] else "failed",
                                    "error": r["error"], "mb": r["mb"], "static_kernel": 0, "sources": "tune"})
                continue
            for i, bs in enumerate(kernel.SPEC.block_candidates if sweep else (kernel.DEFAULT_BLOCKS,)):
                setup = kernel.bench(bs)
                sw(wrap(setup.kernel), wargs(setup.args), target, f"{target}-{m}-k{i}", mode=m, what="kernel",
                   blocks=setup.blocks)

    print(f"\n{title}; runs in {out}")
    rows = [dict(r, **_mode_fields(r)) for r in sw.rows]
    xla = {(r["target"], r["mode"]): r["cycles"] for r in rows if r["what"] == "xla"}
    print_table("{target:6} {mode:6} {what:7} {blocks:38} {cycles:16,.0f} {ratio:11.3f} {mb:7.1f} "
                "{static_kernel:14,}  {source}",
                [dict(r, ratio=r["cycles"] / xla[(r["target"], r["mode"])] if xla.get((r["target"], r["mode"]))
                      else float("nan")) for r in rows],
                {"cycles": "corrected cycles", "ratio": "kernel/xla", "mb": "MB", "static_kernel": "kernel static"})
    return 0


def _mode_fields(r: dict) -> dict:
    """cycles (nan where it did not compile) and source (the ops' cycles sources, or the failure)."""
    ok = r["status"] == "ok"
    return {"cycles": r["corrected"] if ok else float("nan"),
            "source": r["sources"] if ok else f"module {r['status']}: {(r['error'] or '')[:120]}"}


def _mode_line(r: dict) -> str:
    f = _mode_fields(r)
    return (f"{r['target']:4} {r['mode']:4} {r['what']:6} {r['blocks'] or '':38} {f['cycles']:12,.0f} cycles "
            f"{r['mb']:7.1f} MB  kernel static {r['static_kernel']:10,}  [{f['source']}]  {r['wall_s']:.0f}s")


def bench_specs(prog: str, specs, target: str, out=None, static_timeout_s: float | None = None) -> int:
    """`tpudiag kernels bench` of `specs` (KernelSpecs whose bench setup puts a peer in the "JAX
    kernel" column) for `target`, its table printed as markdown: the peer benches' whole run (bench/
    moe_vs_tokamax.py, vs_tpu_inference.py, fp8_modes.py). A bad target is one line naming `prog`
    and exit 2; 1 where a variant failed."""
    import sys

    from tpudiag.api.kernels import kernels_bench
    from tpudiag.capture.tpu_compile import Limits
    from tpudiag.errors import InputError
    from tpudiag.report.registry import render

    limits = Limits(static_timeout_s=static_timeout_s) if static_timeout_s else None
    try:
        result, run = kernels_bench(specs, target, Path(out) if out else None, limits=limits,
                                    progress=lambda m: print(m, file=sys.stderr))
    except InputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(render(result, "md"))
    print(f"run directory: {run}")
    return 0 if result.status == "ok" else 1
