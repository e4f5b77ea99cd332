"""Human formatting of the units carried in names (`_s`, `_ns`, `bytes`, `cycles`, `_hz`), and of the
counts, shares and names the renderers show. The one set of formatters every renderer uses; each
shows None as "-". `printable` (tpudiag/text.py, re-exported here) is the one rule for showing a
program's or compiler's string without letting it drive the terminal (or the page)."""

from __future__ import annotations

from tpudiag.text import clip, printable  # noqa: F401  (the renderers' helpers live beside them)


def fmt_runs(seconds: float | None, runs: int) -> str:
    """One run's time, and how many runs an execution has where that is more than one (a loop
    body's op: `1.20 ms x4`)."""
    return fmt_s(seconds) + (f" x{runs}" if runs > 1 else "")


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    a = abs(seconds)
    if a >= 1:
        return f"{seconds:.2f} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.1f} us"
    if a == 0:
        return "0"
    return f"{seconds * 1e9:.0f} ns"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.825 -> `82.5%` (`82%` with digits=0)."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def fmt_count(n: float | None, unit: str) -> str:
    """1.97e14 -> `197 T<unit>` (SI prefixes up to P, 3 significant digits): FLOPs, FLOP/s, B/s,
    and with unit "" a bare axis label."""
    if n is None:
        return "-"
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def fmt_cycles(n: int | None) -> str:
    """A cycle count in a narrow column: `1.34M`, `97.0k`, `512`."""
    if n is None:
        return "-"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))


def fmt_int(n: int | None) -> str:
    """An exact count with thousands separators (`1,234,567`): cycles in a table that has room."""
    return "-" if n is None else f"{n:,}"


def fmt_ghz(hz: float) -> str:
    return f"{hz / 1e9:.2f} GHz"


def short_source(source: str | None, keep: int = 2) -> str:
    """`/long/path/to/pkg/model.py:12` -> `pkg/model.py:12` (the last `keep` path parts)."""
    if not source:
        return ""
    path, _, line = source.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-keep:]) + (f":{line}" if line else "")


BREAKDOWN_PARTS = (
    ("compute_s", "compute"),
    ("memory_s", "memory"),
    ("communication_s", "communication"),
    ("host_s", "host"),
    ("compile_s", "compile"),
    ("idle_s", "idle"),
)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fusion_summary_lines(summary: dict, top: int = 3) -> list[str]:
    """The fusion summary of one module (`analyze.hlo.fusions.fusion_summary`) as plain lines, names
    made `printable`; none for a module with no fusion break (nothing to say)."""
    if not summary["breaks"]:
        return []
    out = [f"{printable(summary['module'])}: {summary['fusions']} fusions; {summary['breaks']} fusion breaks round-trip "
           f"{fmt_bytes(summary['break_bytes'])} ({fmt_bytes(summary['break_bytes_default_memory'])} in default "
           f"memory), {summary['breaks_not_inferable']} with no inferable reason"]
    for b in summary["top_breaks"][:top]:
        out.append(printable(f"  {fmt_bytes(b['bytes'])}  {b['producer']} -> {b['consumer']}  {b['shape']}  "
                             f"({b['reason']})"))
    return out


def name_list(names, most: int = 8) -> str:
    """`a, b, c`, or the first `most` and how many in all, names made `printable`."""
    names = [printable(n) for n in names]
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


_SETUP_RULE = "no matmul, kernel, sort, scatter or collective; small arguments"


def setup_line(names) -> str:
    """One line naming a profile's setup modules, which get no section of their own."""
    return f"setup modules, not summarized ({_SETUP_RULE}): {name_list(names)}"


def setup_lines(report) -> list[str]:
    """A `CompileReport`'s setup modules as plain lines: those compiled (one row of the module
    table) and those left out of the compile."""
    out = []
    setup = report.grouped_setup
    if setup:
        out.append(f"setup modules ({_SETUP_RULE}): {name_list(m.name for m in setup)}")
    skipped = report.skipped_setup
    if skipped:
        rule = (report.source.get("setup_skipped") or {}).get("rule", "")
        out.append(f"{len(skipped)} setup module(s) not compiled ({printable(rule)}; --each-module compiles them): "
                   f"{name_list(skipped)}")
    return out


def device_lines(device) -> list[str]:
    """A TPU report's device section (`DeviceTime`) as plain lines: per step first, then the rest of the trace."""
    chip = printable(device.chip or "TPU")
    out = []
    st = device.in_steps
    if st is not None:
        m = st.median
        out.append(f"On the {chip}, the median of {st.steps} steps (step {m.step_num}, {fmt_s(m.step_s)}; "
                   f"device busy {fmt_s(m.busy_s)}):")
        # Always compute, memory and idle; the other classes where they hold at least 0.1% of the step.
        out.append("  " + "  ".join(f"{k} {fmt_s(v)} ({fmt_pct(share)})" for k, v, share in m.parts()
                                    if k in ("compute", "memory", "idle") or (share or 0) >= 0.001))
        t = st.total
        out.append(f"All {st.steps} steps: {fmt_s(t.step_s)}, device busy {fmt_s(t.busy_s)}, idle {fmt_s(t.idle_s)} "
                   "(the device waiting on the host).")
        out.append(f"Outside the steps (setup, compile, shutdown): {fmt_s(device.outside_steps_s)}, "
                   f"device busy {fmt_s(device.outside_steps_busy_s)} of it.")
    else:
        out.append(f"On the {chip} (no steps traced): device busy {fmt_s(device.busy_s)}: compute "
                   f"{fmt_s(device.compute_s)}, memory {fmt_s(device.memory_s)}, communication "
                   f"{fmt_s(device.communication_s)}, host {fmt_s(device.host_s)}"
                   + (f", unknown {fmt_s(device.unknown_s)}" if device.unknown_s else "") + ".")
    if device.unknown_s >= 0.001 * device.busy_s and device.unknown_s:  # not a few ns of copy-starts
        out.append(f"Unknown: {fmt_s(device.unknown_s)} of ops the trace records no FLOPs or bytes for (custom calls "
                   "without a cost estimate), so no bound can be measured; XProf says Unknown for them too.")
    if device.async_s:
        out.append(f"Async copies and collectives: {fmt_s(device.async_s)} in flight, "
                   f"{fmt_s(device.async_overlapped_s)} of it while ops ran (counted once, not added to busy time).")
    return out
