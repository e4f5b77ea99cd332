"""Int8 weight-only quantized matmul: x [M, K] @ dequant(w int8 [K, N], scales f32 [N]) -> [M, N].

out[m, n] = sum_k x[m, k] * w[k, n] * scales[n], returned in x's dtype. The weights stay int8 in
HBM and are dequantized block by block in VMEM; the MXU accumulates in f32 and the per-output-
channel scale is applied once to the f32 accumulator (a per-column scale commutes with the sum
over k). `jax.custom_vjp`: dx = g @ dequant(w).T by a second Pallas kernel (the same blocking on
the transposed problem); the scales' cotangent is computed in plain JAX (XLA drops it when unused);
w is int8 and gets a float0 (no) cotangent. This module holds the kernels, the pure-JAX reference,
the plain-JAX version users write, and the `SPEC`. It does not autotune: the default blocks come
from `bench/sweep_int8_matmul.py`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import (block_bytes, check_matmul_operands, check_multiples, dot_by_exact_weights,
                                    exact_weights_scratch, fit_block, mxu_precision, vmem_limit)

# Production shape: a Llama-3-8B MLP up/gate projection (K 4096 -> N 14336). Decode batches are
# M 16-128 tokens (HBM-bound: the int8 weights are the traffic); prefill is M 2048 (MXU-bound).
PROD = dict(m_decode=64, m_prefill=2048, k=4096, n=14336)


@dataclass(frozen=True)
class BlockSizes:
    """Tile of the output (block_m x block_n) and of the contraction (block_k) per grid step.

    block_n and block_k are multiples of 128 (the vreg and MXU are 128 lanes wide; int8 tiles are
    32 x 128, so 128 also satisfies the int8 sublane packing of w's block_k rows); block_m is a
    multiple of 16 (bf16 packs 16 rows per vreg). A dimension smaller than its block is taken
    whole. The backward (dx) kernel reuses the same sizes with the roles of N and K swapped.
    """

    block_m: int = 512
    block_n: int = 1024
    block_k: int = 4096

    def __post_init__(self):
        check_multiples(self, (("block_m", 16), ("block_n", 128), ("block_k", 128)))

    def __str__(self) -> str:
        return f"block_m={self.block_m}, block_n={self.block_n}, block_k={self.block_k}"


# From bench/sweep_int8_matmul.py (v5e): the best of the sweep at decode M64 (at the HBM floor: the
# whole K in one block, so x is read once and the w tile stream never stalls on re-reads) and within
# 2% of the best measured at prefill M2048 (MXU-bound; w is re-read 4x, still under the compute time).
DEFAULT_BLOCKS = BlockSizes(block_m=512, block_n=1024, block_k=4096)


def _check_shapes(x, w, scales):
    check_matmul_operands(x, w, jnp.int8)
    if scales.shape != (w.shape[1],):
        raise ValueError(f"scales must be [N={w.shape[1]}], got {scales.shape}")


def _vmem_limit(x_block, w_block, out_block, xb):
    """Scoped VMEM for one grid step (tiling.vmem_limit): x (or g) in, int8 w in, the [1, w cols]
    f32 scales in, the output out (all in x's dtype but w), pipelined; the f32 accumulator of the
    output block, and the dequantized w tile the kernel makes on purpose: up to 4 + 2 bytes per
    weight (v5e's VPU has no bf16 ALU, so int8 -> bf16 goes through f32; the dx kernel's scale
    multiply is in f32); for f32 x, its three bf16 terms and two f32 remainders
    (tiling.dot_by_exact_weights)."""
    blocks = (block_bytes(x_block, xb) + block_bytes(w_block, 1) + block_bytes((1, w_block[1]), 4)
              + block_bytes(out_block, xb))
    return vmem_limit(blocks, scratch=block_bytes(out_block, 4) + block_bytes(w_block, 4) + block_bytes(w_block, 2)
                      + exact_weights_scratch(x_block, xb))


def _select_f32(keep, a):
    """where(keep, a, 0) computed in f32 and cast back. A bf16 select feeding the MXU makes
    libtpu 0.0.42's static LLO profile abort (LLO_CHECK: "Expected vector-bf16packed, got
    vector-int16" for the vmatmul operand); v5e's VPU does bf16 selects through f32 anyway."""
    return jnp.where(keep, a.astype(jnp.float32), 0.0).astype(a.dtype)


def int8_matmul_kernel(x_ref, w_ref, s_ref, o_ref, acc_ref, *, k_dim: int, block_k: int):
    """Grid (i over M, j over N, kk over K); acc_ref f32 [bm, bn] lives across the kk steps."""
    kk = pl.program_id(2)
    n_k = pl.num_programs(2)

    @pl.when(kk == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(x):
        # int8 -> bf16 is exact (|w| <= 127 needs 7 bits, bf16 has 8 of mantissa), so the MXU sees
        # exactly the stored weights in its native input format; f32 accumulation (bf16 sums over
        # K = 4096 would drift past 1e-2).
        acc_ref[...] += dot_by_exact_weights(x, w_ref[...])

    if k_dim % block_k == 0:
        accumulate(x_ref[...])
    else:
        @pl.when(kk < n_k - 1)
        def _():
            accumulate(x_ref[...])

        # K tail: the edge block reads past K (unspecified values, maybe NaN). Zero x's columns
        # there; w's rows there are int8, hence finite, so 0 * w adds nothing (zeroing w alone would
        # not do: 0 * NaN is NaN). Only the last K step pays for the select.
        @pl.when(kk == n_k - 1)
        def _():
            x = x_ref[...]
            col = kk * block_k + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
            accumulate(_select_f32(col < k_dim, x))

    @pl.when(kk == n_k - 1)
    def _():
        # Per-output-channel scale once on the f32 accumulator, not on every w element.
        o_ref[...] = (acc_ref[...] * s_ref[...]).astype(o_ref.dtype)


def int8_matmul_dx_kernel(g_ref, w_ref, s_ref, dx_ref, acc_ref, *, n_dim: int, block_n: int):
    """dx = g @ (w * s).T. Grid (i over M, kk over K, j over N): the contraction runs over N."""
    j = pl.program_id(2)
    n_j = pl.num_programs(2)

    @pl.when(j == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def accumulate(g, w):
        # Dequantize this w tile in VMEM (f32 multiply, one rounding to g's dtype for the MXU).
        w = (w.astype(jnp.float32) * s_ref[...]).astype(g.dtype)  # [bk, bn]
        # Contract the N dims of g [bm, bn] and w [bk, bn] (an A @ B.T matmul: the MXU takes the
        # transposed operand directly, no transpose is materialised).
        acc_ref[...] += jax.lax.dot_general(g, w, (((1,), (1,)), ((), ())), precision=mxu_precision(g),
                                            preferred_element_type=jnp.float32)

    if n_dim % block_n == 0:
        accumulate(g_ref[...], w_ref[...])
    else:
        @pl.when(j < n_j - 1)
        def _():
            accumulate(g_ref[...], w_ref[...])

        # N tail (the contraction here): the edge blocks of g and of the scales read past N
        # (unspecified values, maybe NaN). Zero both g's tail columns and the dequantized w's
        # (0 * NaN is NaN, so zeroing one side is not enough). Only the last N step pays for it.
        @pl.when(j == n_j - 1)
        def _():
            g = g_ref[...]
            col = j * block_n + jax.lax.broadcasted_iota(jnp.int32, g.shape, 1)
            w = w_ref[...]
            wcol = j * block_n + jax.lax.broadcasted_iota(jnp.int32, w.shape, 1)
            wd = jnp.where(wcol < n_dim, w.astype(jnp.float32) * s_ref[...], 0.0).astype(g.dtype)
            acc_ref[...] += jax.lax.dot_general(_select_f32(col < n_dim, g), wd, (((1,), (1,)), ((), ())),
                                                precision=mxu_precision(g), preferred_element_type=jnp.float32)

    @pl.when(j == n_j - 1)
    def _():
        dx_ref[...] = acc_ref[...].astype(dx_ref.dtype)


def _forward(x, w, scales, block_sizes: BlockSizes, interpret):
    m, k = x.shape
    n = w.shape[1]
    bm, bn, bk = fit_block(block_sizes.block_m, m), fit_block(block_sizes.block_n, n), fit_block(block_sizes.block_k, k)
    gm, gn, gk = pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)
    xb = jnp.dtype(x.dtype).itemsize
    # Bytes this blocking really moves (the minimum, every operand once, when gm == 1 or gk == 1).
    # The pipeline skips a block's DMA when its index is unchanged from the previous step; with K
    # innermost, x's block (i, kk) is re-fetched for every N block unless K is one block, and w's
    # block (kk, j) for every M block unless it is the only w block. Counting the re-reads keeps
    # the HBM floor the bench derives from this honest.
    x_reads = 1 if gk == 1 else gn
    w_reads = 1 if gn * gk == 1 else gm
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=int(x_reads * m * k * xb + w_reads * (k * n + 4 * n) + m * n * xb))
    return pl.pallas_call(
        functools.partial(int8_matmul_kernel, k_dim=k, block_k=bk),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(gm, gn, gk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        # M and N tiles are independent (megacore chips may split them); K carries the accumulator.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit((bm, bk), (bk, bn), (bm, bn), xb)),
        cost_estimate=cost,
        interpret=interpret,
        name="tpudiag_int8_matmul",
    )(x, w, scales.reshape(1, n).astype(jnp.float32))


def _backward_dx(g, w, scales, block_sizes: BlockSizes, interpret):
    m, n = g.shape
    k = w.shape[0]
    # Same tiles with N and K swapped: the output is [bm, bk], the contraction runs over N.
    bm, bk, bn = fit_block(block_sizes.block_m, m), fit_block(block_sizes.block_n, k), fit_block(block_sizes.block_k, n)
    gm, gk, gn = pl.cdiv(m, bm), pl.cdiv(k, bk), pl.cdiv(n, bn)
    gb = jnp.dtype(g.dtype).itemsize
    g_reads = 1 if gn == 1 else gk  # as in the forward: N (the contraction here) is innermost
    w_reads = 1 if gk * gn == 1 else gm
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=int(g_reads * m * n * gb + w_reads * (k * n + 4 * n) + m * k * gb))
    return pl.pallas_call(
        functools.partial(int8_matmul_dx_kernel, n_dim=n, block_n=bn),
        out_shape=jax.ShapeDtypeStruct((m, k), g.dtype),
        grid=(gm, gk, gn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, kk, j: (i, j)),
                  pl.BlockSpec((bk, bn), lambda i, kk, j: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, kk, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bk), lambda i, kk, j: (i, kk)),
        scratch_shapes=[pltpu.VMEM((bm, bk), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit((bm, bn), (bk, bn), (bm, bk), gb)),
        cost_estimate=cost,
        interpret=interpret,
        name="tpudiag_int8_matmul_dx",
    )(g, w, scales.reshape(1, n).astype(jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _int8_matmul(x, w, scales, block_sizes, interpret):
    return _forward(x, w, scales, block_sizes, interpret)


def _int8_matmul_fwd(x, w, scales, block_sizes, interpret):
    return _forward(x, w, scales, block_sizes, interpret), (x, w, scales)


def _int8_matmul_bwd(block_sizes, interpret, res, g):
    x, w, scales = res
    g = g.astype(x.dtype)
    dx = _backward_dx(g, w, scales, block_sizes, interpret)
    # d/d scales[n] = sum_m g[m, n] * (x @ w)[m, n]: plain JAX (a full matmul), dead code that XLA
    # removes when only dx is used, which is the weight-only-quantized fine-tuning case.
    xw = jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    ds = jnp.sum(g.astype(jnp.float32) * xw, axis=0).astype(scales.dtype)
    dw = np.zeros(w.shape, dtype=jax.dtypes.float0)  # int8 weights: no gradient
    return dx, dw, ds


_int8_matmul.defvjp(_int8_matmul_fwd, _int8_matmul_bwd)


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def int8_matmul(x, w, scales, *, block_sizes: BlockSizes | None = None, interpret=False):
    """x [M, K] (bf16 or f32) @ (w int8 [K, N] * scales f32 [N]) -> [M, N] in x's dtype.

    Any M, K, N: edge blocks are masked in the kernel, nothing is padded or copied in HBM.
    Differentiable in x (Pallas dx kernel) and scales (plain JAX); w is int8 and gets no gradient.
    """
    _check_shapes(x, w, scales)
    return _int8_matmul(x, w, scales, block_sizes or DEFAULT_BLOCKS, interpret)


def reference(x, w, scales, *, block_sizes=None):
    """Pure JAX: dequantize w in x's compute dtype (f32, or f64 under x64), matmul, cast back.

    `block_sizes` is accepted and ignored, so verify cases can pass the same params to both."""
    ct = jnp.promote_types(x.dtype, jnp.float32)
    wd = w.astype(ct) * scales.astype(ct)[None, :]
    return jnp.dot(x.astype(ct), wd, precision=jax.lax.Precision.HIGHEST).astype(x.dtype)


def xla_int8_matmul(x, w, scales):
    """What users write without a kernel: dequantize to bf16, then a bf16 matmul."""
    return x @ (w.astype(jnp.bfloat16) * scales.astype(jnp.bfloat16))


# ----------------------------------------------------------------------------- verify cases

def _make(m, k, n, dtype):
    def make_args(key):
        kx, kw, ks = jax.random.split(key, 3)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
        w = jax.random.randint(kw, (k, n), -127, 128, jnp.int32).astype(jnp.int8)
        # Per-channel scales as a symmetric quantizer makes them for N(0, 1/K) weights:
        # max|w| / 127 ~ 3 / (127 sqrt(K)), varied +-50% across channels. Outputs are then O(1).
        base = 3.0 / (127.0 * np.sqrt(k))
        scales = base * jax.random.uniform(ks, (n,), jnp.float32, 0.5, 1.5)
        return x, w, scales

    return make_args


def cases() -> list[Case]:
    """Small shapes with blocks 32 x 128 x 128 so the grid has several steps in every dim."""
    bs = dict(block_sizes=BlockSizes(block_m=32, block_n=128, block_k=128))
    return [
        # M, K, N not multiples of their blocks: interior blocks plus edge blocks in all three dims,
        # masked in the kernel (forward over K, dx over N)
        # Gradients for x only (the Pallas dx kernel). dscales[n] = sum_m g * (x @ w) sums terms of
        # ~1e3 (x @ w is unscaled) that cancel to O(1): f32 rounding alone moves it by ~1e-3 and a
        # bf16 cotangent by ~10, scales no dx-sized tolerance covers; tests/kernels/
        # test_int8_matmul.py checks it against float64 relative to the size of its terms.
        Case("ragged M K N f32", _make(50, 200, 300, jnp.float32), bs, "float32", grad=True),
        Case("ragged M K N bf16", _make(50, 200, 300, jnp.bfloat16), bs, "bfloat16", grad=True),
        # decode-like: M smaller than block_m (the block becomes all of M)
        Case("decode M=8 bf16", _make(8, 200, 300, jnp.bfloat16), bs, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, reason=(
        "f32 inputs and f32 accumulation over K <= 300 products of O(1) outputs; on TPU an f32 dot at "
        "default precision may use bf16 passes, in interpret mode errors are ~1e-6")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "bf16 output (8-bit mantissa, 2^-8 ~ 4e-3 relative rounding) of O(1) values; the kernel "
        "rounds nothing else in the forward (int8 -> bf16 is exact, f32 accumulation, f32 scale)")),
    "bfloat16.grad": Tolerance(atol=4e-2, rtol=2e-2, reason=(
        "dx = g @ dequant(w).T feeds the MXU bf16 g (the cotangent of a bf16 output) and dequant(w) "
        "rounded to bf16: N = 300 products each off by ~2^-9 relative sum to ~0.01-0.03 absolute "
        "on dx of RMS ~2 (measured: 0.026 max, of which 0.02 from rounding dequant(w)); near-zero "
        "dx elements need the absolute term")),
}


# ----------------------------------------------------------------------------- bench

def _args(m):
    sds = jax.ShapeDtypeStruct
    return (sds((m, PROD["k"]), jnp.bfloat16), sds((PROD["k"], PROD["n"]), jnp.int8),
            sds((PROD["n"],), jnp.float32))


def bench(blocks: BlockSizes | None = None, m: int | None = None) -> BenchSetup:
    """At the decode shape by default (M 64); `m=2048` gives the prefill shape."""
    blocks = blocks or DEFAULT_BLOCKS
    m = m or PROD["m_decode"]

    def kernel(x, w, scales):
        return int8_matmul(x, w, scales, block_sizes=blocks)

    return BenchSetup(shape=f"M{m} K{PROD['k']} N{PROD['n']} x bf16, w int8, scales f32", args=_args(m),
                      kernel=kernel, xla=xla_int8_matmul, blocks=str(blocks))


SPEC = KernelSpec(
    name="int8_matmul",
    title="Int8 weight-only matmul: int8 weights dequantized in VMEM, f32 accumulation, scale on the output",
    replaces=("XLA materialises the dequantized bf16 weights in HBM (read int8, write bf16, read bf16 "
              "again: 5 bytes per weight instead of 1) before the matmul; at decode batch sizes the "
              "matmul is HBM-bound on exactly those weight bytes."),
    signature="int8_matmul(x, w, scales, *, block_sizes=None, interpret=False)",
    tuned_for="decode M64 K4096 N14336 (x bf16, w int8, scales f32); prefill M2048 measured too",
    usage=("from tpudiag.kernels.int8_matmul import int8_matmul\n"
           "y = int8_matmul(x, w_int8, scales)  # x [M,K] bf16, w [K,N] int8, scales [N] f32 -> [M,N] bf16"),
    kernel=int8_matmul,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(512, 1024, 4096), BlockSizes(512, 512, 1024), BlockSizes(512, 1024, 1024),
                      BlockSizes(512, 2048, 2048), BlockSizes(1024, 1024, 1024)),
    differentiable=True,
)
