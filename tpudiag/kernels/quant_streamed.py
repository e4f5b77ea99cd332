"""The 8-bit matmuls' quantizing kernel with x and the weight tiles copied by hand (`BlockSizes.stream_chunks`).

Pallas's pipeline waits for every input block of a grid step before the step starts, so the chain's first
step waits for all of x's rows and the whole first weight tile (at M 256 K 4096 in N blocks of 896: 2 MiB
of bf16 x and 3.5 MiB of e4m3 weights) before the MXU can start. Here both stay in HBM and the kernel copies
them itself. At each chain's first step it starts x in `stream_chunks` chunks of K, the first weight tile
in as many chunks, and the second tile. It takes each row's maximum over x's chunks as they land (the
per-token scale needs the whole row). Then it quantizes and multiplies x chunk by chunk (`QUANT_CHUNKS`),
each waiting only for the weight rows it reads. Later steps wait for their tile and start the next one into
the other of two buffers. Nothing is copied across M blocks, so the M axis stays parallel for megacore
chips. On v5e, fp8 at M 256 K 4096 N 14336 in N blocks of 896: 244.1k cycles with the pipeline's copies,
240.7k with 4 chunks (2: 241.8k, 8: 241.4k, 16: 245.9k, many small copies costing more than they overlap).

The copies address whole blocks, so this runs only with one chain of N blocks per M block, where the blocks
tile M and N exactly and K is a multiple of both `stream_chunks` x 128 and the quantization's chunks x 128
(`streams`: 2048 at 4 copies and 16 quantization chunks). Elsewhere `quantized_x_call` keeps the pipeline's
copies without a word, as blocks are fitted to small dimensions without one: `stream_chunks` is a
preference, like the block sizes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.row_quant import row_max, scale_out, scales_of
from tpudiag.kernels.tiling import block_bytes, fit_block, vmem_limit


def streams(bs, m: int, k: int, n: int, quant_chunks: int) -> bool:
    """Whether `streamed_call` takes x [M, K] @ w [K, N] in blocks `bs`: `bs.stream_chunks` set, the
    blocks tiling M and N exactly, and K split into whole lanes by both the copies' chunks and the
    quantization's."""
    c = bs.stream_chunks
    bm, bn = fit_block(bs.block_m, m), fit_block(bs.block_n, n)
    return bool(c) and m % bm == 0 and n % bn == 0 and all(k % (q * 128) == 0 for q in (c, quant_chunks))


def _streamed_kernel(quantize, qmax: float, acc_dtype, bm: int, bn: int, k: int, grid: tuple[int, int],
                     chunks: int, quant_chunks: int):
    kx, kq = k // chunks, k // quant_chunks
    gm, gn = grid

    def streamed_kernel(x_hbm_ref, w_hbm_ref, s_ref, o_ref, x_ref, xq_ref, sx_ref, w_ref, x_sem, w_sem):
        i, j = pl.program_id(0), pl.program_id(1)
        slot = j % 2
        rows = pl.ds(i * bm if gm > 1 else 0, bm)  # one M block: a static offset (a block under 32 rows
        # at a traced offset is refused by Mosaic: not aligned to x's tiles)

        def x_part(c):
            return pltpu.make_async_copy(x_hbm_ref.at[rows, pl.ds(c * kx, kx)],
                                         x_ref.at[:, pl.ds(c * kx, kx)], x_sem.at[c])

        def w_part(c):  # rows of the chain's first tile, into buffer 0
            return pltpu.make_async_copy(w_hbm_ref.at[pl.ds(c * kx, kx), pl.ds(0, bn)],
                                         w_ref.at[0, pl.ds(c * kx, kx), :], w_sem.at[0, c])

        def w_tile(jj, sl):
            return pltpu.make_async_copy(w_hbm_ref.at[:, pl.ds(jj * bn, bn)], w_ref.at[sl], w_sem.at[sl, 0])

        @pl.when(j == 0)
        def _():
            for c in range(chunks):
                x_part(c).start()
            for c in range(chunks):
                w_part(c).start()

            if gn > 1:
                w_tile(1, 1).start()

            amax = None
            for c in range(chunks):
                x_part(c).wait()
                part = row_max(x_ref[:, c * kx:(c + 1) * kx])
                amax = part if amax is None else jnp.maximum(amax, part)
            sx = scales_of(amax, qmax)
            sx_ref[...] = sx
            acc, landed = None, 0
            for c in range(0, k, kq):
                while landed * kx < c + kq:  # the weight rows this chunk reads
                    w_part(landed).wait()
                    landed += 1
                xq, _ = quantize(x_ref[:, c:c + kq], sx)
                xq_ref[:, c:c + kq] = xq
                part = jnp.dot(xq, w_ref[0, c:c + kq, :], preferred_element_type=acc_dtype)
                acc = part if acc is None else acc + part
            scale_out(acc, sx, s_ref, o_ref)

        @pl.when(j > 0)
        def _():
            @pl.when(j + 1 < gn)
            def _():
                w_tile(j + 1, 1 - slot).start()

            w_tile(j, slot).wait()
            scale_out(jnp.dot(xq_ref[...], w_ref[slot], preferred_element_type=acc_dtype), sx_ref[...], s_ref, o_ref)

    return streamed_kernel


def streamed_call(quantize, qmax: float, quant_dtype, acc_dtype, x, w, w_scale, bs, *, quant_chunks: int,
                  name: str, interpret: bool):
    """x [M, K] quantized per token in VMEM (`quantize`, to `quant_dtype`) @ an 8-bit w [K, N] * w_scale [N]
    -> [M, N] in x's dtype, x and the weight tiles copied by the kernel (module docstring); grid (i over M
    parallel, j over N in sequence). Only where `streams(bs, ...)`."""
    m, k = x.shape
    n = w.shape[1]
    bm, bn = fit_block(bs.block_m, m), fit_block(bs.block_n, n)
    gm, gn = m // bm, n // bn
    chunks = bs.stream_chunks
    xb = jnp.dtype(x.dtype).itemsize
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=int(m * k * xb + gm * (k * n + 4 * n) + m * n * xb))
    blocks = block_bytes((1, bn), 4) + block_bytes((bm, bn), xb)  # the pipeline's: scales and output
    # x's copy, an f32 copy of it (the kernel makes one a chunk at a time: this errs high), the quantized
    # x (kept) and a chunk of it in flight, the rows' scales, the two weight buffers, the accumulator and
    # its f32 copy
    scratch = (block_bytes((bm, k), xb) + block_bytes((bm, k), 4) + 2 * block_bytes((bm, k), 1)
               + block_bytes((bm, 1), 4) + 2 * block_bytes((k, bn), 1) + 2 * block_bytes((bm, bn), 4))
    return pl.pallas_call(
        _streamed_kernel(quantize, qmax, acc_dtype, bm, bn, k, (gm, gn), chunks, quant_chunks),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(gm, gn),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, k), x.dtype), pltpu.VMEM((bm, k), quant_dtype),
                        pltpu.VMEM((bm, 1), jnp.float32), pltpu.VMEM((2, k, bn), w.dtype),
                        pltpu.SemaphoreType.DMA((chunks,)), pltpu.SemaphoreType.DMA((2, chunks))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit(blocks, scratch)),
        cost_estimate=cost,
        interpret=interpret,
        name=name,
    )(x, w, w_scale.reshape(1, n).astype(jnp.float32))
