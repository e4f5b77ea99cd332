"""`tpudiag compare BASE CUR`: did CUR get slower (or bigger) than BASE, beyond the noise?

Input: two reports, each a `ProfileReport` (tpudiag.report/1) or a `CompileReport`
(tpudiag.compile/1), or their documents (read into the models once, a bad field a ParseError
naming it), already loaded (the caller does the I/O), and the metric to compare:

- `work` (profile runs; the default for two CPU runs that have it): what the run executed, from its
  optimized HLO (analyze/profile/work.py): the headline is the roofline work (each op execution's
  FLOPs or bytes at a reference chip's peak, whichever binds, summed), with FLOPs, bytes accessed,
  op executions and the peak buffer allocation beside it as `figures`; rows are per module and op.
  None of it depends on the machine's speed, so a busy CI host cannot fail the gate.
- `device_time` (profile runs): the headline is the median step time when both runs have at
  least `min_steps` steps, else the total op self time; rows are per-module and per-op self time.
- `tpu_time`: a compile run's estimated TPU time (headline: the sum over modules; rows: each
  module's `totals.estimated_s` and each op's `estimated_s`), or a profile run's `tpu_estimate`
  section (`profile --target`; headline: the estimated step time; rows: modules and source lines).
- `peak_memory` (compile runs): peak HBM bytes (headline: the largest module's; rows: modules).

Output: a `Comparison` (tpudiag.compare/1, docs/compare.md) with both sides' identity, the headline
(base, cur, delta, delta_pct, spread, regression), module and op rows matched by (module, name),
and the list of regressions. Only the headline decides `regression` (and so the exit code): per-op
times on a noisy host move by tens of percent between two runs of the same program, and the
headline is the one figure with a measured noise band. Rows of the static metrics that grew past
the threshold are `flagged` and listed in `regressions`, marked as not deciding the exit code.

Noise: with enough steps on both sides, each run's spread is its robust standard deviation of one
step (1.4826 x the median absolute deviation of its step times), and the headline regresses only
when the relative increase exceeds `max_regression` AND the absolute increase exceeds the two
spreads summed. Static TPU estimates and memory figures are deterministic: their spread is 0.

Runs of different programs (basename of `program`, or of a compile's `source.input`), backends,
device counts, TPU targets or kinds (profile vs compile) are refused with a `UsageError` naming
both sides and the difference, unless `force=True` (then the difference is a warning).

No I/O: reading run directories or JSON files is the caller's job (api/compare.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import PurePath

from tpudiag.results.compare import SCHEMA, ChangeRow, Comparison, Headline, Regression, Side
from tpudiag.results.compile import CompileReport
from tpudiag.results.profile import ProfileReport
from tpudiag.errors import ParseError, UsageError
PROFILE_SCHEMA = "tpudiag.report/1"
COMPILE_SCHEMA = "tpudiag.compile/1"
METRICS = ("work", "device_time", "tpu_time", "peak_memory")
UNITS = {"work": "s", "device_time": "s", "tpu_time": "s", "peak_memory": "bytes"}
# The machine-independent figures of `work`, compared and flagged beside its headline.
WORK_FIGURES = ("flops", "bytes_accessed", "op_executions", "peak_allocation_bytes")
NOTE = ("only the headline decides the exit code; module and op rows are reported for reading, and a "
        "flagged row does not fail the comparison")


@dataclass(frozen=True)
class CompareConfig:
    # Fewer steps than this on either side: no median and no spread; the headline is total op time.
    # Three is the least that gives a median robust to one outlier: the first step, which on a
    # cold process includes the XLA compile (mlp_steps8_a: step 0 took 366 ms, the median 4.2 ms).
    min_steps: int = 3
    # Machine drift (device_time): each profile run times a fixed ~20 ms CPU loop before and after
    # the program (`calibration_s`); the faster of the two is that run's machine speed (the loop is
    # only ever slowed by other work). Two runs within this fraction of each other ran on a machine of
    # the same speed: the loop's own best-of-3 still varies by this much between runs on this busy
    # 2-core host, so smaller differences are noise, not drift, and nothing is corrected.
    drift_tolerance: float = 0.15
    # Beyond this ratio the machine changed too much to compare measured times: refused (--force
    # compares anyway). In between, cur's step times are divided by the ratio.
    drift_refuse: float = 1.0
    # MAD x 1.4826 estimates the standard deviation of normally distributed step times. The MAD,
    # unlike p10/p90, ignores that compile step: with 8 steps p90 lands inside it.
    mad_to_sigma: float = 1.4826
    # Each run's spread is this many (robust) standard deviations of one step; the two are summed.
    # One sigma each, summed, keeps two runs of the same program apart from a regression on a
    # shared 2-core CI host (mlp_steps8_a vs _b: +9.2% median, spreads 0.06 + 1.49 ms).
    spread_sigmas: float = 1.0
    # A module or op row of a static metric (tpu_time, peak_memory) is flagged when its increase
    # exceeds max_regression and this share of the base headline figure: a 20 ps op estimated at
    # 30 ps is +50% of nothing. device_time rows are never flagged: per-op totals have no measured
    # noise band, and two runs of one program differ by up to +49% on one op (mlp_steps8_a vs _b,
    # dot.1, where the median step moved +9%).
    row_min_share: float = 0.01


DEFAULT_COMPARE_CONFIG = CompareConfig()


# ---------------------------------------------------------------- options


def parse_max_regression(text) -> float:
    """`5%` -> 0.05; a bare number is a fraction (`0.05`). Refuses a bare number above 1 (`5`
    would be 500%), negatives, infinities, NaN and non-numbers, each with a valid example."""
    s = str(text).strip()
    pct = s.endswith("%")
    example = "such as 5% (or the fraction 0.05)"
    try:
        value = float(s[:-1] if pct else s)
    except ValueError:
        raise UsageError(f"--max-regression {text!r}: not a number; give a percentage {example}") from None
    # Checked before any suggestion is built from it: `inf` must not be answered with `inf%`.
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"--max-regression {text!r}: must be a finite amount of 0 or more, {example}")
    if pct:
        return value / 100
    if value > 1:
        raise UsageError(f"--max-regression {text}: a bare number is a fraction (0.05 means 5%); write {value:g}% "
                         f"for {value:g} percent")
    return value


def default_metric(base, cur=None) -> tuple[str, str]:
    """(metric, why) when none is asked for: figures that do not depend on the machine's speed
    wherever the runs have them. Compile runs: `tpu_time`. Profile runs: `tpu_time` when both have
    a TPU estimate (`profile --target`); else, for CPU runs, `work` when both have it (two CPU runs
    differ in speed as the machine's load does); else `device_time`."""
    base = _as_model(base, "base")
    cur = base if cur is None else _as_model(cur, "cur")
    if isinstance(base, CompileReport):
        return "tpu_time", "compile runs: the TPU compiler's estimates"
    if not isinstance(cur, ProfileReport):
        return "device_time", "a profile run"
    if base.tpu_estimate and cur.tpu_estimate:
        return "tpu_time", "both runs have a TPU estimate (profile --target), which no machine's speed changes"
    if base.backend == cur.backend == "cpu" and base.work and cur.work:
        return "work", ("CPU runs: measured time moves with the machine's load, the executed HLO work does not "
                        "(--metric device_time compares measured time)")
    if base.backend == "cpu" and not (base.work and cur.work):
        return "device_time", ("measured time: a side has no executed-work figures (no HLO dump), so the machine's "
                               "speed is part of the difference")
    return "device_time", f"{base.backend} runs: measured device time"


# ---------------------------------------------------------------- reading the reports


def _as_model(report, label: str):
    """A `ProfileReport` or `CompileReport`: as given, or read from its document once (a bad document
    is a ParseError naming the label and the field)."""
    if isinstance(report, (ProfileReport, CompileReport)):
        return report
    schema = report.get("schema") if isinstance(report, dict) else None
    if schema == PROFILE_SCHEMA:
        return ProfileReport.from_dict(report, label)
    if schema == COMPILE_SCHEMA:
        return CompileReport.from_dict(report, label)
    raise ParseError(label, f"schema {schema!r} is not {PROFILE_SCHEMA} or {COMPILE_SCHEMA}")


def _basename(program) -> str | None:
    return PurePath(str(program).replace("\\", "/")).name if program else None


def _identity(report, label: str) -> dict:
    if isinstance(report, ProfileReport):
        est = report.tpu_estimate
        return {"path": label, "schema": PROFILE_SCHEMA, "kind": "profile", "program": report.program,
                "argv": report.argv, "status": report.status, "reason": report.reason, "backend": report.backend,
                "devices": len(report.devices), "target": est.target.topology if est else None,
                "steps": report.steps.count}
    return {"path": label, "schema": COMPILE_SCHEMA, "kind": "compile", "program": report.source.get("input"),
            "argv": None, "status": report.status, "reason": None, "backend": "tpu", "devices": None,
            "target": report.target.topology, "steps": None}


def _versions(report) -> dict:
    """jax, jaxlib, libtpu... of the run (profile reports record them; compile reports do not)."""
    return (report.versions or {}) if isinstance(report, ProfileReport) else {}


def _differences(b: dict, c: dict, metric: str) -> list[str]:
    out = []
    if b["kind"] != c["kind"]:
        out.append(f"a {b['kind']} run vs a {c['kind']} run")
    pb, pc = _basename(b["program"]), _basename(c["program"])
    if pb and pc and pb != pc:
        out.append(f"program {pb} vs {pc}")
    if b["kind"] == c["kind"] == "profile":
        if b["backend"] != c["backend"]:
            out.append(f"backend {b['backend']} vs {c['backend']}")
        if b["devices"] != c["devices"]:
            out.append(f"{b['devices']} vs {c['devices']} devices")
    # A profile run's TPU target matters only when its TPU estimate is what is compared.
    tb = b["target"] if b["kind"] == "compile" or metric == "tpu_time" else None
    tc = c["target"] if c["kind"] == "compile" or metric == "tpu_time" else None
    if tb and tc and tb != tc:
        out.append(f"target {tb} vs {tc}")
    return out


# ---------------------------------------------------------------- one side's figures


@dataclass(frozen=True)
class _Side:
    total: float  # the headline figure when no step median applies
    basis: str  # what `total` is
    steps: tuple[float, ...]  # step durations (device_time only)
    modules: dict  # module name -> value
    ops: dict  # (module, name) -> value
    occurrences: dict  # (module, name) -> executions (device_time only)
    notes: tuple[str, ...]
    total_estimate: float | None = None  # a profile's total TPU estimate, when `total` is its step estimate


def _device_time(report, ident: dict) -> _Side:
    label = ident["path"]
    if ident["kind"] != "profile":
        raise UsageError(f"{label}: device_time needs a profile run; this is a compile run "
                         "(compare compile runs with --metric tpu_time or peak_memory)")
    modules, ops, occ = {}, {}, {}
    for o in report.ops:
        key = (o.module, o.name)  # program ids differ between runs; (module, name) does not
        ops[key] = ops.get(key, 0.0) + o.self_s
        occ[key] = occ.get(key, 0) + o.occurrences
        modules[o.module] = modules.get(o.module, 0.0) + o.self_s
    steps = tuple(r.duration_s for r in report.steps.rows)
    return _Side(report.totals.op_self_s, "total_op_time", steps, modules, ops, occ, ())


def _work(report, ident: dict) -> _Side:
    label = ident["path"]
    if ident["kind"] != "profile":
        raise UsageError(f"{label}: work needs a profile run; this is a compile run (compare compile runs with "
                         "--metric tpu_time or peak_memory)")
    if report.work is None:
        raise UsageError(f"{label}: no executed-work figures in this run (no HLO dump to cost its ops; a bare "
                         "trace or a report written before tpudiag recorded them); use --metric device_time")
    modules, ops, occ = {}, {}, {}
    for o in report.work.ops:
        key = (o.module, o.name)
        ops[key] = ops.get(key, 0.0) + o.roofline_s
        occ[key] = occ.get(key, 0) + o.executions
        modules[o.module] = modules.get(o.module, 0.0) + o.roofline_s
    notes = ()
    if report.work.uncosted_ops:
        notes = (f"{label}: {report.work.uncosted_ops} traced op(s) have no instruction in the HLO dump and count as "
                 "no work",)
    return _Side(report.work.roofline_s, f"roofline_work_per_{report.work.per}", (), modules, ops, occ, notes)


def _tpu_time(report, ident: dict) -> _Side:
    label = ident["path"]
    if ident["kind"] == "profile":
        est = report.tpu_estimate
        if not est:
            raise UsageError(f"{label}: no TPU estimate in this profile run (profile it with --target, or compare "
                             "compile runs)")
        modules, notes = {}, []
        for m in est.modules:
            if m.tpu_estimated_s is None:
                notes.append(f"{label}: module {m.name} has no TPU estimate ({m.status}); left out")
                continue
            modules[m.name] = modules.get(m.name, 0.0) + m.tpu_estimated_s
        ops = {(None, r.source): r.tpu_estimated_s for r in est.lines}
        total = sum(m.tpu_estimated_total_s or 0.0 for m in est.modules)
        if est.step.tpu_estimated_s is not None:
            return _Side(est.step.tpu_estimated_s, "tpu_step_estimate", (), modules, ops, {}, tuple(notes), total)
        return _Side(total, "tpu_total_estimate", (), modules, ops, {}, tuple(notes))
    modules, ops, notes = {}, {}, []
    for m in report.modules:
        if not m.ok or m.estimated_s is None:
            notes.append(f"{label}: module {m.name} failed to compile ({m.error}); left out")
            continue
        modules[m.name] = modules.get(m.name, 0.0) + m.estimated_s  # a function compiled at two shapes: summed
        for o in m.ops:
            ops[(m.name, o.name)] = ops.get((m.name, o.name), 0.0) + o.total_s
    return _Side(sum(modules.values()), "tpu_total_estimate", (), modules, ops, {}, tuple(notes))


def _peak_memory(report, ident: dict) -> _Side:
    label = ident["path"]
    if ident["kind"] != "compile":
        raise UsageError(f"{label}: peak_memory needs a compile run (tpudiag compile); a profile run has no HBM "
                         "figures")
    modules, notes = {}, []
    for m in report.modules:
        peak = m.memory.get("peak_hbm_bytes")
        if not m.ok or peak is None:
            notes.append(f"{label}: module {m.name} has no peak HBM figure ({m.error or m.status}); left out")
            continue
        modules[m.name] = max(modules.get(m.name, 0), int(peak))
    # Modules run one after another: the program needs the largest module's peak, not the sum.
    return _Side(max(modules.values(), default=0), "peak_hbm_largest_module", (), modules, {}, {}, tuple(notes))


_EXTRACT = {"work": _work, "device_time": _device_time, "tpu_time": _tpu_time, "peak_memory": _peak_memory}


# ---------------------------------------------------------------- comparing


def _round(x, unit: str):
    if x is None:
        return None
    return int(round(x)) if unit == "bytes" else round(float(x), 12)  # 1 ps: keeps static estimates' digits


def _pct(delta: float, base: float) -> float | None:
    return None if not base else round(100 * delta / base, 3)


def _drift(base, cur, labels: list[str], cfg: CompareConfig, force: bool) -> tuple[float, str | None]:
    """(the factor to divide cur's step times by, a warning) from the two runs' calibration loops.
    1.0 and no warning when either run has none (runs made before calibration, bare traces)."""
    cals = [r.calibration_s for r in (base, cur)]
    if not all(cals):
        return 1.0, None
    b, c = min(cals[0]), min(cals[1])
    ratio = c / b
    shown = f"the calibration loop took {b * 1e3:.1f} ms in base and {c * 1e3:.1f} ms in cur ({ratio:.2f}x)"
    if abs(ratio - 1) <= cfg.drift_tolerance:
        return 1.0, None
    if abs(ratio - 1) > cfg.drift_refuse and not force:
        raise UsageError(f"the machine's speed changed between the runs: {shown}; measured times cannot be "
                         "compared (--force compares anyway; --metric work compares the executed HLO work)")
    return ratio, f"machine drift: {shown}; cur's step times are divided by {ratio:.2f}"


def _spread(steps: tuple[float, ...], cfg: CompareConfig) -> float:
    med = statistics.median(steps)
    mad = statistics.median(abs(s - med) for s in steps)
    return cfg.spread_sigmas * cfg.mad_to_sigma * mad


def _verdict(delta: float, base: float, spread: float, max_regression: float) -> str:
    if delta == 0:
        return "unchanged"
    rel = abs(delta) / base if base else math.inf
    if rel <= max_regression:
        return "within_threshold"
    if abs(delta) <= spread:
        return "within_noise"
    return "regression" if delta > 0 else "improvement"


def _rows(bmap: dict, cmap: dict, unit: str, floor: float | None, limit: float, occ_b=None, occ_c=None) -> list[dict]:
    """One row per key on either side, largest absolute change first. A row is flagged when it grew by
    at least `floor` and by more than `limit` (relative); `floor` None: rows are never flagged."""
    rows = []
    for key in set(bmap) | set(cmap):
        b, c = bmap.get(key), cmap.get(key)
        delta = (c or 0) - (b or 0)
        status = "added" if b is None else "removed" if c is None else "unchanged" if b == c else "changed"
        flagged = floor is not None and delta > 0 and delta >= floor and (not b or delta / b > limit)
        row = {"name": key[1] if isinstance(key, tuple) else key, "base": _round(b, unit), "cur": _round(c, unit),
               "delta": _round(delta, unit), "delta_pct": _pct(delta, b or 0), "status": status, "flagged": flagged}
        if isinstance(key, tuple):
            row["module"] = key[0]
            if occ_b is not None:
                row["occurrences_base"], row["occurrences_cur"] = occ_b.get(key), occ_c.get(key)
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta"]), r.get("module") or "", r["name"] or ""))
    return rows


def _work_figures(bw, cw, limit: float) -> list[dict]:
    """FLOPs, bytes, op executions and peak allocation of both runs, in WORK_FIGURES order; a figure that
    grew past `limit` is flagged (only the headline decides the exit code)."""
    rows = []
    for name in WORK_FIGURES:
        b, c = getattr(bw, name), getattr(cw, name)
        delta = (c or 0) - (b or 0)
        status = "added" if b is None and c is not None else "removed" if c is None and b is not None else \
            "unchanged" if b == c else "changed"
        rows.append({"name": name, "base": b, "cur": c, "delta": delta, "delta_pct": _pct(delta, b or 0),
                     "status": status, "flagged": bool(b) and c is not None and delta / b > limit})
    return rows


def _side(ident: dict) -> Side:
    argv = ident["argv"]
    return Side(**{**ident, "argv": tuple(argv) if argv is not None else None})


def _regression_entry(kind: str, row: dict, decides_exit: bool) -> dict:
    entry = {"kind": kind, "name": row["name"], "base": row["base"], "cur": row["cur"], "delta": row["delta"],
             "delta_pct": row["delta_pct"], "decides_exit": decides_exit}
    if kind == "op":
        entry["module"] = row["module"]
    return entry


def compare_reports(base: dict, cur: dict, metric: str | None, max_regression: float, force: bool = False, *,
                    base_path: str | None = None, cur_path: str | None = None,
                    config: CompareConfig = DEFAULT_COMPARE_CONFIG) -> Comparison:
    """The `tpudiag.compare/1` result (a `Comparison`) of CUR against BASE.

    `metric`: one of METRICS, or None for `default_metric(base)`. `max_regression`: a fraction
    (0.05 = 5%). `base_path`/`cur_path` name the sides in the document and in errors (default:
    each document's `artifacts.run_dir`). Raises UsageError for runs that are not comparable
    (unless `force`) or a metric a side lacks; ParseError for a document missing a field.
    """
    if metric is not None and metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if not (isinstance(max_regression, (int, float)) and math.isfinite(max_regression) and max_regression >= 0):
        raise UsageError(f"max_regression {max_regression!r}: must be a finite fraction >= 0 (0.05 = 5%)")
    labels = []
    for doc, given, side in ((base, base_path, "base"), (cur, cur_path, "cur")):
        artifacts = doc.artifacts if isinstance(doc, (ProfileReport, CompileReport)) else (
            doc.get("artifacts") if isinstance(doc, dict) else None)
        labels.append(str(given or (artifacts or {}).get("run_dir") or side))
    base, cur = _as_model(base, labels[0]), _as_model(cur, labels[1])
    metric, metric_reason = (metric, "asked for") if metric else default_metric(base, cur)
    bid, cid = _identity(base, labels[0]), _identity(cur, labels[1])
    warnings = []
    diffs = _differences(bid, cid, metric)
    if diffs and not force:
        raise UsageError(f"refusing to compare {bid['path']} with {cid['path']}: {'; '.join(diffs)} "
                         "(--force compares them anyway)")
    if diffs:
        warnings.append(f"compared despite: {'; '.join(diffs)}")
    changed = [f"{name} {bv} vs {cv}" for name in ("jax", "jaxlib", "libtpu")
               if (bv := _versions(base).get(name)) and (cv := _versions(cur).get(name)) and bv != cv]
    if changed:
        warnings.append(f"different tool versions ({'; '.join(changed)}): compiler changes are part of the difference")
    for ident in (bid, cid):
        if not ident["program"]:
            warnings.append(f"{ident['path']}: program unknown, so it was not checked")
        if ident["status"] not in ("ok", None):
            why = f" ({ident['reason']})" if ident["reason"] else ""
            warnings.append(f"{ident['path']}: run status {ident['status']}{why}; its figures cover only what was "
                            "captured")

    bs, cs = _EXTRACT[metric](base, bid), _EXTRACT[metric](cur, cid)
    warnings += [*bs.notes, *cs.notes]
    unit = UNITS[metric]
    basis, spread, spreads = bs.basis, 0.0, (0.0, 0.0)
    b_value, c_value = bs.total, cs.total
    if metric == "device_time":
        nb, nc = len(bs.steps), len(cs.steps)
        if nb >= config.min_steps and nc >= config.min_steps:
            basis = "median_step"
            scale, note = _drift(base, cur, labels, config, force)
            if note:
                warnings.append(note)
            c_steps = tuple(t / scale for t in cs.steps)
            b_value, c_value = statistics.median(bs.steps), statistics.median(c_steps)
            spreads = (_spread(bs.steps, config), _spread(c_steps, config))
            spread = spreads[0] + spreads[1]
        else:
            spread, spreads = None, (None, None)
            warnings.append(f"steps: {nb} in base, {nc} in cur (fewer than {config.min_steps} on a side): the "
                            "headline is total op time, with no noise estimate")
        if nb != nc and nb and nc:
            warnings.append(f"base traced {nb} steps and cur {nc}: module and op rows are totals over each run, "
                            "not per step")
    elif bs.basis != cs.basis:  # profile TPU estimates with a step time on one side only
        basis = "tpu_total_estimate"
        b_value = bs.total if bs.total_estimate is None else bs.total_estimate
        c_value = cs.total if cs.total_estimate is None else cs.total_estimate
        warnings.append("only one side has an estimated TPU step time: the headline is the total estimate")
    if metric == "tpu_time" and bid["kind"] == cid["kind"] == "compile":
        # "ok", "off" or "dropped: why": static cycles on one side, roofline floors on the other.
        how = {m.name: m.static_profile.split(":")[0] for m in base.modules}
        for m in cur.modules:
            was, now = how.get(m.name), m.static_profile.split(":")[0]
            if was is not None and was != now:
                warnings.append(f"module {m.name}: static cycle profile {was} in base, {now} in cur; the "
                                "estimates were made differently")

    delta = c_value - b_value
    verdict = _verdict(delta, b_value, spread or 0.0, max_regression)
    headline = {"basis": basis, "base": _round(b_value, unit), "cur": _round(c_value, unit),
                "delta": _round(delta, unit), "delta_pct": _pct(delta, b_value),
                "spread": _round(spread, unit), "base_spread": _round(spreads[0], unit),
                "cur_spread": _round(spreads[1], unit), "verdict": verdict, "regression": verdict == "regression"}
    floor = None if metric == "device_time" else config.row_min_share * abs(b_value)
    modules = _rows(bs.modules, cs.modules, unit, floor, max_regression)
    ops = _rows(bs.ops, cs.ops, unit, floor, max_regression,
                *((bs.occurrences, cs.occurrences) if metric == "device_time" else ()))
    figures = _work_figures(base.work, cur.work, max_regression) if metric == "work" else None
    if metric == "work" and base.work.per != cur.work.per:
        warnings.append(f"base's work is per {base.work.per} and cur's per {cur.work.per} (one traced no steps): "
                        "setup outside the steps counts on one side only")
    regressions = [_regression_entry("headline", {**headline, "name": basis}, True)] if headline["regression"] else []
    regressions += [_regression_entry("module", r, False) for r in modules if r["flagged"]]
    regressions += [_regression_entry("op", r, False) for r in ops if r["flagged"]]
    regressions += [_regression_entry("figure", r, False) for r in figures or () if r["flagged"]]
    return Comparison(
        schema=SCHEMA, metric=metric, unit=unit, max_regression_pct=round(100 * max_regression, 6),
        base=_side(bid), cur=_side(cid), forced=bool(diffs), differences=tuple(diffs),
        headline=Headline(**headline), modules=tuple(ChangeRow(**r) for r in modules),
        ops=tuple(ChangeRow(**r) for r in ops), regressions=tuple(Regression(**r) for r in regressions),
        regression=headline["regression"], note=NOTE, warnings=tuple(warnings), metric_reason=metric_reason,
        figures=None if figures is None else tuple(ChangeRow(**r) for r in figures))
