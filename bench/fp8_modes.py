"""`fp8_matmul`'s two modes side by side, at decode and at a prefill chunk, in one run.

The kernel bench row is the fp8 mode (e4m3 x e4m3) at decode; this adds the weight-only mode
(`activations="bf16"`: the e4m3 tile upcast in VMEM) at the same shape, and both at M 2048, where
the matmul is compute-bound and the static profile shows the MXU's rate on e4m3 operands. Each row's
XLA variant is the same program without the kernel.

    python bench/fp8_modes.py --target v5e [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def specs():
    from tpudiag.kernels import fp8_matmul as f

    out = []
    for m in (f.PROD["m_decode"], 2048):
        for mode in ("fp8", "bf16"):
            def bench(blocks=None, chip=None, m=m, mode=mode):  # at M, in the blocks it takes there
                return f.bench(blocks, chip=chip, activations=mode, m=m)

            out.append(dataclasses.replace(f.SPEC, name=f"fp8_matmul_{mode}_m{m}", bench=bench))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v5e")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from sweep_common import bench_specs

    return bench_specs("fp8_modes", specs(), args.target, args.out)

if __name__ == "__main__":
    sys.exit(main())
