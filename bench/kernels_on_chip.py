"""The bundled kernels on a chip, as `tpudiag kernels bench` on a TPU reports them, from runs made in
parts: the chip worker's rows (`RUN/chip-bench.jsonl` of `tpudiag kernels bench --on-chip`, later
files replacing earlier rows) and a static bench's report (`tpudiag kernels bench --static`, for the
floors and the static figures), joined by analyze/compile/kernel_bench.py's `with_chip`.

    python bench/kernels_on_chip.py STATIC/report.json CHIP1.jsonl [CHIP2.jsonl ...] [--md]

Prints the chip table (Markdown with --md, as in bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from rich.console import Console

    from tpudiag.analyze.compile.kernel_bench import bench_document, chip_time, with_chip
    from tpudiag.report.kernels_render import render_chip, render_bench_markdown
    from tpudiag.results.kernels import KernelBench

    ap = argparse.ArgumentParser()
    ap.add_argument("static", type=Path)
    ap.add_argument("chip", type=Path, nargs="+")
    ap.add_argument("--md", action="store_true")
    a = ap.parse_args()
    static = KernelBench.from_dict(json.loads(a.static.read_text()), str(a.static))
    rows, device = {}, None
    for path in a.chip:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "device" in r:
                device = r["device"]
            elif r.get("status") != "running":
                rows.setdefault(r["kernel"], {})[r["variant"]] = r
    clock = static.target["clock_hz"]
    kernels = [with_chip(k, {v: chip_time(r) for v, r in rows.get(k.name, {}).items()}, clock, static.static_profile)
               for k in static.kernels]
    doc = bench_document(static.target, kernels, static.static_profile, device)
    if a.md:
        print(render_bench_markdown(doc).split("\n### tpudiag kernels bench")[0])
    else:
        render_chip(doc, Console(width=200))


if __name__ == "__main__":
    main()
