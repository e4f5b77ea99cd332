"""Human formatting of the units carried in names (`_s`, `_ns`, `bytes`)."""

from __future__ import annotations


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


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


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
    """The fusion summary of one module (`analyze.fusions.fusion_summary`) as plain lines."""
    out = [f"{summary['module']}: {summary['fusions']} fusions; {summary['breaks']} fusion breaks round-trip "
           f"{fmt_bytes(summary['break_bytes'])} ({fmt_bytes(summary['break_bytes_default_memory'])} in default "
           f"memory), {summary['breaks_not_inferable']} with no inferable reason"]
    for b in summary["top_breaks"][:top]:
        out.append(f"  {fmt_bytes(b['bytes'])}  {b['producer']} -> {b['consumer']}  {b['shape']}  ({b['reason']})")
    return out
