"""Time bundled kernels' block-size points on an attached TPU, in one process (the chip is opened
once; nothing is compiled for the static profile, so a sweep of tens of points takes minutes).

    python bench/chip_sweep.py OUT.jsonl KERNEL:POINT|POINT... [KERNEL:...]

A POINT is `field=v;field=v` (the kernel's default block sizes with those fields replaced; a field
`@name=v` replaces a field of the bench's shape instead, e.g. `@page_size=16;pages_per_block=64`), the
index of one of its block candidates, or `xla` / `jax` (its bench's comparison variants). Each
point is timed as `tpudiag kernels bench --on-chip` times a variant (capture/chip_bench.py: device
time from the trace, 5 calls, argument sets rotated beyond twice VMEM) and written to OUT.jsonl as
it finishes, with the point's block sizes. `tpudiag kernels tune --on-chip` is the product's sweep;
this script is for many kernels in one short device session.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time


def _points(spec, text: str, chip):
    items, labels = [], {}
    for n, pt in enumerate(text.split("|")):
        label = f"p{n}"  # module names must stay plain: the trace is searched by them
        try:
            if pt in ("xla", "jax"):
                setup = spec.bench_setup(None, chip)
                fn = setup.xla if pt == "xla" else setup.jax_kernel
                if fn is None:
                    raise ValueError(f"{spec.name} has no {pt} variant")
                items.append((label, fn, setup.args_for(pt)))
                labels[label] = pt
                continue
            kw = {k: int(v) for k, v in (x.split("=") for x in pt.split(";"))} if "=" in pt else {}
            shape = {k[1:]: v for k, v in kw.items() if k.startswith("@")}
            kw = {k: v for k, v in kw.items() if not k.startswith("@")}
            if kw or shape:
                blocks = dataclasses.replace(type(spec.block_candidates[0])(), **kw) if kw else None
            else:
                blocks = spec.block_candidates[int(pt)]
            if shape:  # the bench at another shape (fields of the kernel's production shape)
                setup = spec.bench(blocks, shape=shape, **({"chip": chip} if spec.chip_bench else {}))
            else:
                setup = spec.bench_setup(blocks, chip)
            items.append((label, setup.kernel, setup.args_for("kernel")))
            labels[label] = setup.blocks + "".join(f"; {k}={v}" for k, v in shape.items())
        except Exception as e:  # block sizes the kernel refuses
            print(json.dumps({"kernel": spec.name, "point": pt, "status": "failed", "error": str(e)[:300]}), flush=True)
    return items, labels


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from tpudiag.capture.chip_bench import time_functions
    from tpudiag.kernels.registry import get_spec
    from tpudiag.targets import resolve_target

    chip = resolve_target("v5e").chip
    with open(argv[0], "a") as out:
        for arg in argv[1:]:
            name, _, pts = arg.partition(":")
            spec = get_spec(name)
            items, labels = _points(spec, pts, chip)

            def emit(row):
                if row.get("status") == "running":
                    return
                row = {k: v for k, v in row.items() if k != "run_us"}
                row["blocks"] = labels.get(row.get("variant"))
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(json.dumps(row), flush=True)

            t = time.time()
            time_functions(name, items, 5, 2 * chip.vmem_bytes, emit, None)
            print(f"# {name}: {time.time() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
