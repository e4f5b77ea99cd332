"""`tpudiag suggest`: which ops deserve a custom kernel, from a compile report and its optimized HLO.

In two steps, so that the caller can compile the kernels in between (this module does no I/O):

1. `candidates(report, modules)`: the pattern matches of each compiled module (the detectors of
   analyze/suggest/detectors/), grouped by (module, pattern, source line), groups that share a
   source line merged, so a pattern's forward, its recomputation and its backward ops count together, each with the estimated TPU time of exactly the ops it covers (`xla_s`, from the
   compile report's op rows) and its share of the module's estimated time. A matmul fusion that
   only absorbed a norm's last multiply stays out of a norm's ops: the matmul is not what the
   kernel replaces.
2. `build_report(...)`: each candidate with the price of its replacement (the bundled kernel
   compiled at its shapes, or its detector's roofline bound where none fits), the speedup and the
   seconds saved, the confidence and its reason, whether it clears the minimums of
   `SuggestConfig`, XLA's own replacements, and the static findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tpudiag.results.compile import CompileReport
from tpudiag.analyze.hlo.vocabulary import MATMUL, is_gradient
from tpudiag.analyze.suggest.detectors import find_patterns
from tpudiag.analyze.suggest.detectors.base import PatternMatch
from tpudiag.analyze.suggest.measured import CYCLES_SOURCE as MEASURED
from tpudiag.results.suggest import SCHEMA, Finding, Replaced, Suggestion, SuggestReport


@dataclass(frozen=True)
class SuggestConfig:
    # Below this share of its module's estimated time a pattern is not worth a kernel: a 2% op made
    # twice as fast saves 1% of the step, less than the noise of the estimate itself.
    min_share: float = 0.02
    # Below this speedup the kernel does not beat XLA by more than the estimates' own error (static
    # cycles for compute, the HBM floor for memory-bound ops: TPU-NOTES puts the HBM model 2-4x off).
    min_speedup: float = 1.25


DEFAULT_SUGGEST_CONFIG = SuggestConfig()


@dataclass(frozen=True)
class Candidate:
    match: PatternMatch  # the first match of the group (its shapes: the forward pass)
    module: str
    ops: tuple[str, ...]
    source: tuple[str, ...]
    xla_s: float
    module_s: float
    static_ok: bool  # the module's static profile ran: its op times are the compiler's cycles
    covered: int = field(default=1)  # matches merged into it
    backward: bool = False  # some of its ops are the pattern's gradient (JAX's `transpose(jvp(...))` ops)
    runs: int = 1  # runs per execution of the module: the trip counts of the loops around it
    instance_shapes: tuple = ()  # each instance's shapes, where the merged matches hold several (layers)
    measured: bool = False  # its XLA time was measured on a TPU (a TPU profile run), not estimated

    @property
    def instances(self) -> int:
        return max(1, len(self.instance_shapes))

    @property
    def share(self) -> float:
        return self.xla_s / self.module_s if self.module_s else 0.0


def _instances(module, pms) -> tuple:
    """The shapes of each instance among matches merged at one source line: two layers, or RoPE's q
    and k, are two instances (the kernel runs twice); a gradient matched apart from its forward
    reads the same data (its detector names it: `PatternMatch.instance`) and is the same instance.
    A gradient in another loop than its forward (a scan over layers: the backward loop recomputes
    the forward's scores from its own copies of q and k) reads other instructions; it is the
    gradient of a forward instance of its shapes where there is one, since the kernel is priced
    forward and backward together."""
    seen: dict = {}
    gradients = []
    for pm in pms:
        if any(is_gradient(module.instruction(o)) for o in pm.ops):
            gradients.append(pm)
        else:
            seen.setdefault(pm.instance or pm.anchors[0], pm.shapes)
    forward_shapes, folded = list(seen.values()), set()
    for pm in gradients:
        key = pm.instance or pm.anchors[0]
        if key in seen or key in folded:
            continue
        if pm.shapes in forward_shapes:
            forward_shapes.remove(pm.shapes)  # this forward instance's gradient
            folded.add(key)
            continue
        seen[key] = pm.shapes
    return tuple(seen.values())


def _has_matmul(module, op_name: str) -> bool:
    instr = module.instruction(op_name)
    if instr is None:
        return False
    if instr.opcode in MATMUL:
        return True
    comps, seen = [c for c in instr.called], set()
    while comps:
        name = comps.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        for i in module.computations[name].instructions:
            if i.opcode in MATMUL:
                return True
            comps.extend(i.called)
    return False


def _merge_overlapping(groups: dict) -> list[list[PatternMatch]]:
    """Groups of one pattern that share a source line are one: a forward and its recomputation in
    the backward (remat) reach the same line from different first lines."""
    merged: list[tuple[str, set, list]] = []
    for (pattern, _), pms in groups.items():
        lines = {s for pm in pms for s in pm.source}
        hits = [g for g in merged if g[0] == pattern and g[1] & lines]
        for g in hits:
            merged.remove(g)
            lines |= g[1]
            pms = g[2] + pms
        merged.append((pattern, lines, pms))
    return [pms for _, _, pms in merged]


def candidates(report: CompileReport, modules: dict) -> tuple[list[Candidate], list[Replaced]]:
    """Grouped matches of every compiled module with their XLA time; and XLA's own replacements.
    `modules`: {the module's `artifacts` directory: its optimized HloModule} (a function compiled at
    two shapes is two modules of one name)."""
    cands, replaced = [], []
    for m in report.modules:
        hlo = modules.get(m.artifacts)
        if not m.ok or hlo is None or m.totals is None:
            continue
        times = {o.name: o.total_s for o in m.ops}  # every run in one execution (loop bodies)
        runs = {o.name: o.runs for o in m.ops}
        groups: dict[tuple, list[PatternMatch]] = {}
        for pm in find_patterns(hlo):
            if pm.replaced_by_xla:
                same = next((r for r in replaced if (r.pattern, r.module, r.by) == (pm.pattern, m.name,
                                                                                 pm.replaced_by_xla)), None)
                if same is None:
                    replaced.append(Replaced(pattern=pm.pattern, module=m.name, by=pm.replaced_by_xla, ops=pm.ops,
                                             source=pm.source, notes=pm.notes))
                else:  # one kernel XLA wrote, in several custom calls (metadata, then the matmul)
                    replaced[replaced.index(same)] = replace(same, ops=same.ops + pm.ops,
                                                             source=same.source + pm.source)
                continue
            groups.setdefault((pm.pattern, pm.source[:1]), []).append(pm)
        for pms in _merge_overlapping(groups):
            ops, source = [], []
            for pm in pms:
                ops += [o for o in pm.ops if o not in ops and o in times
                        and (pm.detector.matmul_work or not _has_matmul(hlo, o))]
                source += [s for s in pm.source if s not in source]
            if not ops:
                continue
            backward = any(is_gradient(hlo.instruction(o)) for o in ops)
            instances = _instances(hlo, pms)
            cands.append(Candidate(match=pms[0], module=m.name, ops=tuple(ops), source=tuple(source),
                                   xla_s=sum(times[o] for o in ops), module_s=m.totals.estimated_s,
                                   static_ok=m.static_profile == "ok", covered=len(pms), backward=backward,
                                   runs=max(runs[o] for o in ops), instance_shapes=instances,
                                   measured=any(o.cycles_source == MEASURED for o in m.ops)))
    cands.sort(key=lambda c: (-c.xla_s, c.module, c.match.pattern))
    return cands, replaced


@dataclass(frozen=True)
class Price:
    """What the replacement costs: a compiled kernel's estimate, or why none was compiled."""

    kernel: str | None
    kernel_s: float | None
    static_ok: bool = False  # the kernel's module kept its static profile
    why_not: str | None = None  # no kernel fits, or it failed to lower or compile
    snippet: str | None = None
    description: str | None = None
    floor_s: float | None = None  # the compiled kernel's roofline floor at these shapes (one run, one instance)
    calibrated: str | None = None  # how the chip's calibration moved kernel_s, where it did
    measured_as: str = ""  # the chip table's entry for the kernel's path here ("": the kernel's own)
    step_scale: float = 1.0  # the kernel's time here in its floors over the bench's (AtShapes.step_scale)


def _confidence(c: Candidate, p: Price, basis: str, fig=None, xla_basis: str = "static") -> tuple[str, str]:
    if basis == "measured_table":
        xla = ("XLA's ops measured on the chip" if c.measured else
               f"XLA's ops at {fig.xla_over_floor:.3g}x the kernel's floor, as XLA's version took at the bench shape"
               if xla_basis == "measured_table" else "XLA's ops from " + ("static cycles" if c.static_ok else
                                                                          "roofline floors"))
        return "medium", (f"{xla}; the kernel at {fig.efficiency:.0%} of its roofline floor here "
                          f"({p.floor_s * 1e6:.4g} us a run), as it ran on a {fig.device} at its bench shape "
                          f"({fig.kernel_us:,.1f} us" + (f"; XLA {fig.xla_us:,.1f} us" if fig.xla_us else "")
                          + f"): `{fig.command}`")
    if c.measured:
        xla = "XLA's ops measured on the chip"
    else:
        xla = "XLA's ops from " + ("static cycles" if c.static_ok else
                                   "roofline floors (the module's static profile did not run)")
    if basis == "compiled":
        kern = "static cycles" if p.static_ok else "roofline floors (its static profile did not run)"
        if p.calibrated:
            kern += "; " + p.calibrated
        level = "high" if (c.static_ok or c.measured) and p.static_ok else "medium"
        why = f"{xla}; the kernel, compiled at these shapes for the same target, from {kern}"
    elif basis == "roofline_bound":
        level = "low"
        why = (f"{xla}; no kernel compiled ({p.why_not}), so the replacement is the pattern's "
               "roofline bound: the least any kernel could take")
    else:
        level = "low"
        why = f"{xla}; {p.why_not}"
    return level, why + ("; the kernel's time is not measured" if c.measured else "; no TPU measurement")


def build_report(run_dir: str, report: CompileReport, cands: list[Candidate], replaced: list[Replaced],
                 prices: dict[int, Price], bounds: dict[int, float | None], findings: list[Finding],
                 measured: dict | None = None, config: SuggestConfig = DEFAULT_SUGGEST_CONFIG,
                 notes=(), per_step: dict | None = None, chip_table: dict | None = None) -> SuggestReport:
    """`prices` and `bounds` are keyed by the candidate's index in `cands`; `measured` ({source line:
    measured op self seconds} of a profile run; its CPU op names are not the TPU's) adds each
    suggestion's share of measured op time; `per_step` ({module name: its executions per traced
    step}, from a profile run) turns each saving per execution into a saving per step; `chip_table`
    ({kernel: kernels.measured.ChipFigure} of the target's chip) prices a forward kernel, and XLA's
    ops where the run did not measure them, from the chip's measured times."""
    rows, replaced = [], list(replaced)
    measured_total = sum(measured.values()) if measured else 0.0
    for i, c in enumerate(cands):
        p = prices.get(i) or Price(None, None, why_not="not priced")
        bound = bounds.get(i)
        if bound is not None and c.xla_s < FUSED_BELOW * bound * c.runs:
            # XLA's separate ops for it take well under the least its data movement needs: the rest
            # is fused into the matmuls around it (a norm's row sum in the producer's fusion, its
            # scaling in the consumer's), so there is no pass over memory for a kernel to save.
            replaced.append(Replaced(
                pattern=c.match.pattern, module=c.module, by="fusion into its matmuls", ops=c.ops, source=c.source,
                notes=(f"its own ops take {c.xla_s * 1e6:.3g} us against the {bound * 1e6:.3g} us its data needs "
                       "at HBM bandwidth: XLA does the rest inside the neighbouring matmul fusions",)))
            continue
        # The kernel is priced for one run of one instance (at the first instance's shapes); a loop
        # body's pattern runs `runs` times, and each instance at the source line (a layer) once more.
        # The bound is already the sum over the instances' own shapes.
        xla_s, share = c.xla_s, c.share
        xla_basis = "measured_run" if c.measured else "static"
        fig = ((chip_table or {}).get(p.measured_as or p.kernel) if p.kernel and p.floor_s and not c.backward
               else None)
        if fig is not None:
            # The chip's measured times at the kernel's bench shape, scaled to these shapes by the
            # kernel's roofline floor: the kernel reaches the same share of its floor, and XLA (where
            # this run did not measure it) takes the same multiple of it.
            basis, kernel_s = "measured_table", fig.seconds_at(p.floor_s, p.step_scale) * c.runs * c.instances
            if not c.measured and fig.xla_over_floor:
                xla_s = p.floor_s * fig.xla_over_floor * c.runs * c.instances
                xla_basis = "measured_table"
                share = xla_s / max(c.module_s - c.xla_s + xla_s, xla_s)
        elif p.kernel_s is not None:
            basis, kernel_s = "compiled", p.kernel_s * c.runs * c.instances
        elif bound is not None:
            basis, kernel_s = "roofline_bound", bound * c.runs
        else:
            basis, kernel_s = "none", None
        speedup = xla_s / kernel_s if kernel_s else None
        saved = xla_s - kernel_s if kernel_s is not None else None
        confidence, reason = _confidence(c, p, basis, fig, xla_basis)
        shown = share >= config.min_share and speedup is not None and speedup >= config.min_speedup
        mshare = None
        if measured_total:
            mshare = round(sum(measured.get(src, 0.0) for src in c.source) / measured_total, 6)
        notes_ = list(c.match.notes) + ([f"{c.covered} matches at this source line"] if c.covered > 1 else [])
        if c.instances > 1:
            notes_.append(f"{c.instances} instances at this source line (one per layer or tensor), each priced")
        if c.backward:
            notes_.append("its ops include the backward pass" + ("; the kernel is priced forward and backward"
                                                                 if basis == "compiled" else ""))
        if p.description:
            notes_.append(f"kernel compiled at {p.description}")
        if c.runs > 1:
            notes_.append(f"runs {c.runs} times per execution of {c.module} (a loop body): the times count every run")
        rows.append(Suggestion(
            pattern=c.match.pattern, kernel=p.kernel, module=c.module, ops=c.ops, source=c.source,
            shapes=c.match.shapes.to_dict(), share=round(share, 6), xla_s=round(xla_s, 12),
            kernel_s=None if kernel_s is None else round(kernel_s, 12), kernel_basis=basis,
            expected_speedup=None if speedup is None else round(speedup, 3),
            saved_s=None if saved is None else round(saved, 12), confidence=confidence, reason=reason,
            snippet=p.snippet, notes=tuple(notes_), shown=shown, measured_share=mshare, backward=c.backward,
            runs=c.runs, executions_per_step=(per_step or {}).get(c.module),
            saved_per_step_s=None if saved is None or (per_step or {}).get(c.module) is None
            else round(saved * per_step[c.module], 12), xla_measured=True if c.measured else None,
            xla_basis=xla_basis if xla_basis == "measured_table" else None))
    rows.sort(key=lambda r: (not r.shown, -(r.saved_per_step_s if r.saved_per_step_s is not None else r.saved_s or 0.0),
                             -r.share, r.module, r.pattern))
    out_notes = list(notes)
    if not any(r.shown for r in rows):
        out_notes.append("no op clears the minimums (share of its module's estimated time >= "
                         f"{config.min_share:.0%}, expected speedup >= {config.min_speedup:g}x): XLA's own code is "
                         "as good as a bundled kernel here (tpudiag suggest --all lists every match)")
    return SuggestReport(schema=SCHEMA, run_dir=run_dir, target=report.target.topology, chip=report.target.chip,
                         suggestions=tuple(rows), replaced=tuple(replaced), findings=tuple(findings),
                         hidden=sum(1 for r in rows if not r.shown), notes=tuple(out_notes))


# A match whose priced ops take less than this fraction of its roofline bound is fused into the
# matmuls around it, not a candidate for a kernel.
FUSED_BELOW = 0.5


def roofline_bound(c: Candidate, chip) -> float | None:
    """The least seconds `c`'s pattern needs on `chip` at its shapes (its detector's bound, summed over
    its instances), forward and backward where its ops include the gradient; None where the shapes
    do not say enough."""
    bounds = [c.match.detector.bound(shapes, chip, c.backward) for shapes in c.instance_shapes or (c.match.shapes,)]
    return None if any(b is None for b in bounds) else sum(bounds)


def findings_for(report: CompileReport, modules: dict, cands: list[Candidate], hbm_bytes_per_s: float) -> list[Finding]:
    """Layout findings of the modules that compute (a matmul or a matched pattern) and hold at least
    `min_module_share` of the run's estimated time: the random-number setup's u32 fusion breaks are
    not the step's."""
    from tpudiag.analyze.suggest.layout import DEFAULT_FINDINGS_CONFIG, module_findings

    total = sum(m.totals.estimated_s for m in report.modules if m.artifacts in modules and m.totals is not None)
    with_patterns = {c.module for c in cands}
    out: list[Finding] = []
    for m in report.modules:
        hlo = modules.get(m.artifacts)
        if hlo is None or m.totals is None or not total:
            continue
        computes = m.name in with_patterns or any(i.opcode in MATMUL for i in hlo.instructions())
        if computes and m.totals.estimated_s >= DEFAULT_FINDINGS_CONFIG.min_module_share * total:
            out += module_findings(hlo, m.name, hbm_bytes_per_s, m.fusions)
    return out


def unpriced_report(report: CompileReport, modules: dict, chip, run_dir: str = "") -> SuggestReport:
    """The suggestions a compile report carries: the matches with their XLA time and each pattern's
    roofline bound, no kernel compiled (`tpudiag suggest RUN` compiles them)."""
    cands, replaced = candidates(report, modules)
    bounds = {i: roofline_bound(c, chip) for i, c in enumerate(cands)}
    prices = {i: Price(None, None, why_not=c.match.detector.no_kernel if c.match.detector.kernel is None
                       else "not compiled here: tpudiag suggest RUN compiles the bundled kernel at these shapes")
              for i, c in enumerate(cands)}
    findings = findings_for(report, modules, cands, chip.hbm_bytes_per_s)
    return build_report(run_dir, report, cands, replaced, prices, bounds, findings)
