"""What the MXU reaches at the quantized matmuls' shapes: XLA's own bf16 dot, beside the fp8 kernel.

At M 256 and 512 on v5e the fp8 mode of `fp8_matmul` sits about 5% above its compute floor. This prints,
from one static profile each, the cycles of XLA's plain bf16 x bf16 dot fusion at the same M, K and N
(no quantization, no conversion: the MXU's best case there as the compiler schedules it), the fp8
kernel in the blocks it takes at that M, and a plain Pallas matmul in the same blocks whose x comes
already in e4m3 (nothing quantized: what Mosaic's matmul alone takes on that grid), each against the
bf16 compute floor (2 M K N at the chip's bf16 peak, which is v5e's e4m3 rate). The dot's row is the
fusion alone: the weight layout copy XLA adds in front of it is not part of the matmul.

    python bench/mxu_reference.py --target v5e [--m 256 512] [--out DIR]
    python bench/mxu_reference.py --target tpu7x:2x2x1 --square     # the clock check below

`--square` profiles XLA's 4096³ bf16 dot on one device instead: its static cycles against the peak
at the chip table's clock, the check behind each chip's derived `clock_hz` (docs/targets.md).
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--m", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--square", action="store_true", help="a 4096^3 bf16 dot only: static cycles against the peak")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from sweep_common import measure, run_root, target_or_none

    from tpudiag.kernels import fp8_matmul

    target = target_or_none(a.target, "mxu_reference")
    if target is None:
        return 2
    chip = target.chip
    k, n = fp8_matmul.PROD["k"], fp8_matmul.PROD["n"]
    root = run_root(a.out, "mxu-reference")
    sds = jax.ShapeDtypeStruct

    def dot(x, w):
        return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    if a.square:
        s = 4096
        r = measure(dot, (sds((s, s), jnp.bfloat16), sds((s, s), jnp.bfloat16)), a.target, root / "square")
        per_device = chip.peak_bf16_flops_per_s * target.chips / target.devices
        floor = 2 * s ** 3 / per_device * chip.clock_hz
        static = max((o["static"] or 0 for o in r["op_rows"] or []), default=0)
        shown = f"{static:,} cycles, {floor / static:.1%} of the peak" if static else f"{r['status']} {r['error']}"
        print(f"{a.target}: XLA's 4096^3 bf16 dot on one device, loops stepped through: {shown} "
              f"(the peak: {floor:,.0f} cycles at {chip.clock_hz / 1e9:.2f} GHz)")
        return 0

    print(f"{a.target}: K {k} N {n}; cycles, and against the bf16 floor (2 M K N at "
          f"{chip.peak_bf16_flops_per_s / 1e12:.0f} TFLOP/s)")
    for m in a.m:
        floor = 2 * m * k * n / chip.peak_bf16_flops_per_s * chip.clock_hz
        rows = []
        r = measure(dot, (sds((m, k), jnp.bfloat16), sds((k, n), jnp.bfloat16)), a.target, root / f"dot-m{m}")
        fusion = [o for o in r["op_rows"] or [] if o["opcode"] == "fusion" and o["compute"] > 0]
        rows.append(("XLA bf16 dot (the fusion)", max((o["cycles"] for o in fusion), default=None), r))
        setup = fp8_matmul.bench(None, chip, m=m)
        r = measure(setup.kernel, setup.args, a.target, root / f"fp8-m{m}")
        rows.append((f"fp8_matmul, fp8 mode ({setup.blocks})", r["corrected"], r))
        blocks = fp8_matmul.blocks_for(m, chip)
        plain = _plain_matmul(m, k, n, blocks)
        r = measure(plain, (sds((m, k), fp8_matmul.FP8), sds((k, n), fp8_matmul.FP8), sds((1, n), jnp.float32)),
                    a.target, root / f"plain-m{m}")
        rows.append(("Pallas matmul, x already e4m3, the same blocks", r["corrected"], r))
        for label, cycles, r in rows:
            shown = f"{cycles / 1e3:.1f}k  {cycles / floor:.3f}x" if cycles else f"{r['status']} {r['error'] or ''}"
            print(f"  M {m:<5} {label:<58} {shown}", flush=True)
    print(f"run directories: {root}")
    return 0


def _plain_matmul(m: int, k: int, n: int, blocks):
    """x e4m3 [M, K] @ w e4m3 [K, N] * scales [1, N] -> bf16 in the fp8 kernel's blocks: whole K, M
    blocks parallel, N blocks in sequence (the grid of one chain a core, v5e's), no quantization
    (Mosaic's matmul alone)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from tpudiag.kernels.tiling import block_bytes, fit_block, vmem_limit

    bm, bn = fit_block(blocks.block_m, m), fit_block(blocks.block_n, n)
    limit = vmem_limit(block_bytes((bm, k), 1) + block_bytes((k, bn), 1) + block_bytes((1, bn), 4)
                       + block_bytes((bm, bn), 2), 2 * block_bytes((bm, bn), 4))

    def kernel(x_ref, w_ref, s_ref, o_ref):
        acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = (acc * s_ref[...]).astype(o_ref.dtype)

    def call(x, w, s):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16), grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
            in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                      pl.BlockSpec((1, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                                 vmem_limit_bytes=limit))(x, w, s)
    return call


if __name__ == "__main__":
    sys.exit(main())
