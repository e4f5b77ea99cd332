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

Machine drift (device_time median steps, drift.py): when both runs timed the calibration loop, the
time verdict is given only if each run's samples stayed within `calibration_spread_max` of each
other and the verdict is the same with cur's times uncorrected and divided by every ratio of the
two runs' loop times that the samples allow (up to `calibration_sensitivity` power); otherwise,
and when only one run timed it or they timed different loops, it is `refused`, with the reason,
and the `work` verdict (the `fallback` headline) decides when both runs have executed-work figures.

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

from tpudiag.analyze.compare import drift
from tpudiag.results.compare import SCHEMA, ChangeRow, Comparison, Headline, Regression, Side
from tpudiag.results.compile import CompileReport
from tpudiag.results.profile import NO_BACKEND, ProfileReport
from tpudiag.errors import ParseError, UsageError
PROFILE_SCHEMA = "tpudiag.report/1"
COMPILE_SCHEMA = "tpudiag.compile/1"
METRICS = ("work", "device_time", "tpu_time", "peak_memory")
UNITS = {"work": "s", "device_time": "s", "tpu_time": "s", "peak_memory": "bytes"}
# The machine-independent figures of `work`, compared and flagged beside its headline.
WORK_FIGURES = ("flops", "bytes_accessed", "op_executions", "peak_allocation_bytes")
NOTE = ("only the headline decides the exit code; module and op rows are reported for reading, and a "
        "flagged row does not fail the comparison")
# Added to NOTE when the time verdict was refused and the work headline decides instead.
FALLBACK_NOTE = "; the time verdict was refused, so the executed-work headline (`fallback`) decides instead"


@dataclass(frozen=True)
class CompareConfig:
    # Fewer steps than this on either side: no median and no spread; the headline is total op time.
    # Three is the least that gives a median robust to one outlier: the first step, which on a
    # cold process includes the XLA compile (mlp_steps8_a: step 0 took 366 ms, the median 4.2 ms).
    min_steps: int = 3
    # Machine drift (device_time, median steps; drift.py, docs/compare.md#machine-drift). Each profile
    # run times a fixed CPU loop before the program, after traced steps and after it (~10 samples for
    # 8 steps). A run whose samples, the slowest against the fastest, are more than this far apart
    # had its machine change speed during it: no one ratio describes it, and its time verdict is
    # refused. Measured on the shared 2-core host (load average 5-7 from other users): 58-163% with two
    # busy-loops started at the first step, and 42-186% without, so times there are refused too (two
    # runs of one program had median steps 4.3 and 10.7 ms, and a run of twice the work a lower median
    # step than its base). A quarter: far above the timing noise expected of a 12 ms loop on an idle
    # machine (not measured: the shared host never was idle), far below what a busy-loop caused.
    calibration_spread_max: float = 0.25
    # This share of a run's slowest samples is set aside before its spread is taken (one of 10): a
    # single sample slowed by a passing process is not the machine changing speed. Never the fastest:
    # nothing makes the loop faster than the machine is.
    calibration_trim: float = 0.1
    # A steady machine of another speed: a time verdict must hold with cur's figure as measured and
    # divided by any ratio of the loop's times the samples allow, raised up to this power: a program
    # whose threads wait on each other may slow more than the loop's independent threads. Measured
    # with two busy-loops throughout vs none (sized_mlp's steps between single runs of the loop, one
    # process, 2-core host): steps 1.72x, 1.04x, 0.96x, 1.14x, 2.18x where the loop read 3.67x, 1.22x,
    # 1.16x, 1.62x, 2.84x; once 5.40x where it read 1.75x, with samples spread far past the limit
    # above. The square covers the steady cases with a margin; the spread limit, the rest.
    calibration_sensitivity: float = 2.0
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
    # A run that traced nothing (its program failed before jax started) records no backend and no
    # devices: what it never recorded cannot differ, and its failure is the verdict (`run_failed`).
    if b["kind"] == c["kind"] == "profile" and NO_BACKEND not in (b["backend"], c["backend"]):
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


def _spread(steps: tuple[float, ...], cfg: CompareConfig) -> float:
    med = statistics.median(steps)
    mad = statistics.median(abs(s - med) for s in steps)
    return cfg.spread_sigmas * cfg.mad_to_sigma * mad


_DIRECTION = {"regression": 1, "improvement": -1}  # any other verdict: no change beyond the noise


def _pct_text(delta: float, base: float) -> str:
    return f"{100 * delta / base:+.1f}%" if base else f"{delta:+.3g}"


def _refusal(cal, b_value: float, c_value: float, spread: float, max_regression: float) -> str | None:
    """Why measured times cannot decide (one line), or None: a run's machine changed speed during it,
    or the verdict is not the same at every correction the calibration allows (drift.py)."""
    if not cal.consistent:
        return drift.inconsistency(cal)
    verdicts = [_verdict(v - b_value, b_value, spread, max_regression) for v in (c_value, cal.cur_low, cal.cur_high)]
    if len({_DIRECTION.get(v, 0) for v in verdicts}) == 1:
        return None
    return (f"the verdict depends on the correction for the machine's speed: the median step moved "
            f"{_pct_text(c_value - b_value, b_value)} as measured, and {_pct_text(cal.cur_low - b_value, b_value)} "
            f"to {_pct_text(cal.cur_high - b_value, b_value)} with cur's times divided by anything from "
            f"{min(1.0, cal.ratio_low) ** cal.sensitivity:.2f} to {max(1.0, cal.ratio_high) ** cal.sensitivity:.2f}"
            f" (the calibration loop took {cal.ratio:.2f}x as long in cur, {cal.ratio_low:.2f}-{cal.ratio_high:.2f}x "
            f"from sample to sample; a program may slow by up to that ratio to the power {cal.sensitivity:g})")


def _fallback(base, cur, bid: dict, cid: dict, max_regression: float, warnings: list[str]) -> Headline | None:
    """The `work` headline that decides when the time verdict is refused; None when a side has no
    executed-work figures."""
    if base.work is None or cur.work is None:
        return None
    bw, cw = _work(base, bid), _work(cur, cid)
    warnings += [*bw.notes, *cw.notes]
    if base.work.per != cur.work.per:
        warnings.append(f"base's work is per {base.work.per} and cur's per {cur.work.per} (one traced no steps): "
                        "setup outside the steps counts on one side only")
    delta = cw.total - bw.total
    verdict = _verdict(delta, bw.total, 0.0, max_regression)
    return Headline(basis=bw.basis, base=_round(bw.total, "s"), cur=_round(cw.total, "s"), delta=_round(delta, "s"),
                    delta_pct=_pct(delta, bw.total), spread=0.0, base_spread=0.0, cur_spread=0.0, verdict=verdict,
                    regression=verdict == "regression")


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
    failed = []
    for ident, side in ((bid, "BASE"), (cid, "CUR")):
        if not ident["program"]:
            warnings.append(f"{ident['path']}: program unknown, so it was not checked")
        if ident["status"] not in ("ok", None):
            why = f" ({ident['reason']})" if ident["reason"] else ""
            warnings.append(f"{ident['path']}: run status {ident['status']}{why}; its figures cover only what was "
                            "captured")
            failed.append(f"{side} {ident['path']} is a {ident['status']} run{why}")

    bs, cs = _EXTRACT[metric](base, bid), _EXTRACT[metric](cur, cid)
    warnings += [*bs.notes, *cs.notes]
    unit = UNITS[metric]
    basis, spread, spreads = bs.basis, 0.0, (0.0, 0.0)
    b_value, c_value = bs.total, cs.total
    calibration = mismatch = None
    if metric == "device_time":
        nb, nc = len(bs.steps), len(cs.steps)
        if nb >= config.min_steps and nc >= config.min_steps:
            basis = "median_step"
            b_value, c_value = statistics.median(bs.steps), statistics.median(cs.steps)
            spreads = (_spread(bs.steps, config), _spread(cs.steps, config))
            spread = spreads[0] + spreads[1]
            calibration, mismatch = drift.check(base, cur, labels, c_value, config)
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
    fallback = None
    refused = mismatch or (calibration and _refusal(calibration, b_value, c_value, spread, max_regression))
    if refused:
        verdict = "refused"
        fallback = _fallback(base, cur, bid, cid, max_regression, warnings)
    headline = {"basis": basis, "base": _round(b_value, unit), "cur": _round(c_value, unit),
                "delta": _round(delta, unit), "delta_pct": _pct(delta, b_value),
                "spread": _round(spread, unit), "base_spread": _round(spreads[0], unit),
                "cur_spread": _round(spreads[1], unit), "verdict": verdict, "regression": verdict == "regression",
                "refused": refused}
    floor = None if metric == "device_time" else config.row_min_share * abs(b_value)
    modules = _rows(bs.modules, cs.modules, unit, floor, max_regression)
    ops = _rows(bs.ops, cs.ops, unit, floor, max_regression,
                *((bs.occurrences, cs.occurrences) if metric == "device_time" else ()))
    figures = _work_figures(base.work, cur.work, max_regression) if metric == "work" else None
    if metric == "work" and base.work.per != cur.work.per:
        warnings.append(f"base's work is per {base.work.per} and cur's per {cur.work.per} (one traced no steps): "
                        "setup outside the steps counts on one side only")
    regressions = [_regression_entry("headline", {**headline, "name": basis}, True)] if headline["regression"] else []
    if fallback is not None and fallback.regression:
        regressions.append(_regression_entry("headline", {**fallback.to_dict(), "name": fallback.basis}, True))
    regressions += [_regression_entry("module", r, False) for r in modules if r["flagged"]]
    regressions += [_regression_entry("op", r, False) for r in ops if r["flagged"]]
    regressions += [_regression_entry("figure", r, False) for r in figures or () if r["flagged"]]
    return Comparison(
        schema=SCHEMA, metric=metric, unit=unit, max_regression_pct=round(100 * max_regression, 6),
        base=_side(bid), cur=_side(cid), forced=bool(diffs), differences=tuple(diffs),
        headline=Headline(**headline), modules=tuple(ChangeRow(**r) for r in modules),
        ops=tuple(ChangeRow(**r) for r in ops), regressions=tuple(Regression(**r) for r in regressions),
        regression=headline["regression"] or bool(fallback and fallback.regression),
        note=NOTE + (FALLBACK_NOTE if fallback else ""),
        warnings=tuple(warnings), metric_reason=metric_reason,
        figures=None if figures is None else tuple(ChangeRow(**r) for r in figures), calibration=calibration,
        fallback=fallback, run_failed="; ".join(failed) or None)
