"""W8A8 matmul for serving: x [M, K] (bf16) quantized per token to int8 inside the kernel, times int8
weights w [K, N] with per-output-channel scales [N], accumulated in int32 on the MXU.

    sx[m]    = max_k |x[m, k]| / 127            (per-token scale; a zero row keeps scale 1)
    xq[m, k] = round(x[m, k] / sx[m])           (int8, in [-127, 127])
    out[m, n] = (sum_k xq[m, k] * w[k, n]) * sx[m] * w_scale[n]     in x's dtype

This is what a w8a8 checkpoint (SmoothQuant-style, per-channel weights, dynamic per-token
activations) computes in a serving engine. Without a kernel XLA runs the activation quantization as
its own fusion (x read, xq and sx written to HBM, read again by the int8 dot) before the matmul;
here x's rows are quantized in VMEM (once per M block where the N blocks run in sequence, else at
each grid step), so x is read once and nothing quantized goes back to HBM. The whole K is one block: a token's scale needs its whole row (K up to
28,672 at bf16 is 56 KiB a row). Edge blocks in M and N need no masking: rows and columns past the
array are computed from unspecified values and dropped when the block is written, and no
contraction runs over them. No gradient: this is an inference kernel.

Holds the kernel, the pure-JAX reference, the plain-JAX version users write, and the `SPEC`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.quant_streamed import streamed_call, streams
from tpudiag.kernels.row_quant import row_scales, scale_out
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape
from tpudiag.kernels.tiling import block_bytes, check_matmul_operands, check_multiples, fit_block, vmem_limit

# Production shape: Llama 3 8B's MLP up/gate projection (K 4096 -> N 14336); decode M 64 tokens,
# prefill chunks M 2048.
PROD = dict(m_decode=64, m_prefill=2048, k=4096, n=14336)
_QMAX = 127.0


@dataclass(frozen=True)
class BlockSizes:
    """Output tile per grid step (block_m x block_n); K is always whole. block_m is a multiple of
    32 (int8 and fp8 pack 32 rows per vreg), block_n of 128 (lanes). A dimension smaller than its
    block is taken whole."""

    block_m: int = 256
    block_n: int = 2048
    # With one M block: 0 quantizes x again at every N block (the N blocks all parallel); c >= 1 runs
    # the N blocks as c sequential chains, parallel to each other, and quantizes x once per chain
    # (needs the N blocks to split evenly; else as 0). One chain a core: 1 on v5e and v6e, 2 on v5p.
    x_chains: int = 0
    # Where x is quantized once per chain of N blocks (one chain per M block): c >= 1 copies x and the
    # weight tiles by hand, the chain's first tile and x in c chunks of K, so its first step starts on
    # the first chunks (`quant_streamed`); 0 leaves the copies to the pipeline, as do blocks that do not
    # tile M and N exactly and a K that is not a multiple of c x 128 and QUANT_CHUNKS x 128
    # (`quant_streamed.streams`).
    stream_chunks: int = 0

    def __post_init__(self):
        check_multiples(self, (("block_m", 32), ("block_n", 128)))
        for field in ("x_chains", "stream_chunks"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")

    def __str__(self) -> str:
        chains = f", x_chains={self.x_chains}" if self.x_chains else ""
        stream = f", stream_chunks={self.stream_chunks}" if self.stream_chunks else ""
        return f"block_m={self.block_m}, block_n={self.block_n}{chains}{stream}"


# `tpudiag kernels tune w8a8_matmul --target v5e` (decode M64): N blocks of 2048 are 1.06x faster
# than 1024 and 1.17x than 512 (fewer re-reads of x, longer weight DMAs); block_m does not matter
# at M64 (the block is all of M) and 256 keeps a prefill chunk's x block at 2 MiB.
DEFAULT_BLOCKS = BlockSizes()
# A prefill chunk (M >= PREFILL_M) in M blocks of 512: with 256 the weights are read once per M
# block, 32 times at M8192, and at K4096 N14336 on v6e the kernel is HBM-bound 1.14x above XLA's
# figure; with 512 it sits at its compute floor, 0.90x XLA (bench/sweep_serving.py, matmul-blocks).
PREFILL_M = 2048
PREFILL_BLOCKS = BlockSizes(block_m=512)


def default_blocks(m: int) -> BlockSizes:
    """The blocks `block_sizes=None` takes for x [M, K]."""
    return PREFILL_BLOCKS if m >= PREFILL_M else DEFAULT_BLOCKS


def _check_shapes(x, w, w_scale):
    check_matmul_operands(x, w, jnp.int8)
    if w_scale.shape != (w.shape[1],):
        raise ValueError(f"w_scale must be [N={w.shape[1]}], got {w_scale.shape}")


def quantize_rows(x, scale=None):
    """Per-row symmetric int8 quantization in f32: (xq int8, scale f32 [rows, 1]). `scale` given
    (`row_scales(rows, 127)` of whole rows) quantizes a slice of columns of those rows."""
    scale = row_scales(x, _QMAX) if scale is None else scale
    xq = jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -_QMAX, _QMAX).astype(jnp.int8)
    return xq, scale


# Below a prefill chunk (M < PREFILL_M), where x is quantized once for a chain of N blocks
# (`x_chains`), the chain's first block quantizes it in this many chunks of K (where K is a multiple
# of QUANT_CHUNKS x 128; else whole) and multiplies each as it is made, so the MXU starts on the first chunk while
# the VPU quantizes the next. On v5e, fp8 at M256 K4096 N14336 in N blocks of 896: 248.2k cycles
# with x quantized whole first, 244.1k in 16 chunks (244.3k in 8); at M512 in two M blocks of 256,
# 487.5k -> 479.7k. A prefill chunk quantizes each block whole: its N blocks hide the quantization
# already (w8a8 at M 8192 is at its floor on v5e and v6e), and the chunked step's code took that
# kernel's static profile on v5e past tpudiag's 8 GiB limit.
QUANT_CHUNKS = 16


def quantizing_kernel(quantize, qmax: float, acc_dtype, *, cached: bool, k_chunks: int = 1):
    """The 8-bit matmuls' kernel with x quantized in VMEM: quantize the block's rows (`quantize`:
    (rows, scale) -> (quantized, scale), the scale `row_scales(rows, qmax)`), one matmul over the
    whole K into `acc_dtype`, both scales on the result. `cached` (the N blocks run in sequence:
    several M blocks, or chains of N blocks, `x_chains`): the rows are quantized once, at the first N
    block of the sequence, into VMEM scratch and reused by the others: quantizing is VPU work on
    every element of x, otherwise done once per N block (at M8192 K4096 N14336, 7 times). With
    `k_chunks` > 1 that first block quantizes in that many chunks of K (each a multiple of 128, else
    whole), each multiplied as it is made."""
    def kernel(x_ref, w_ref, s_ref, o_ref):
        xq, sx = quantize(x_ref[...], row_scales(x_ref[...], qmax))
        scale_out(jnp.dot(xq, w_ref[...], preferred_element_type=acc_dtype), sx, s_ref, o_ref)

    def cached_kernel(x_ref, w_ref, s_ref, o_ref, xq_ref, sx_ref):
        first = pl.program_id(1) == 0

        @pl.when(first)
        def _():
            sx = row_scales(x_ref[...], qmax)
            sx_ref[...] = sx
            k = x_ref.shape[1]
            step = k // k_chunks if k % (k_chunks * 128) == 0 else k
            acc = None
            for c in range(0, k, step):
                xq, _ = quantize(x_ref[:, c:c + step], sx)
                xq_ref[:, c:c + step] = xq
                part = jnp.dot(xq, w_ref[c:c + step, :], preferred_element_type=acc_dtype)
                acc = part if acc is None else acc + part
            scale_out(acc, sx, s_ref, o_ref)

        @pl.when(jnp.logical_not(first))
        def _():
            scale_out(jnp.dot(xq_ref[...], w_ref[...], preferred_element_type=acc_dtype), sx_ref[...], s_ref, o_ref)

    return cached_kernel if cached else kernel


def quantized_x_call(quantize, qmax: float, quant_dtype, acc_dtype, x, w, w_scale, bs: BlockSizes, *,
                     name: str, interpret: bool):
    """x quantized per token in VMEM (`quantize`, to `quant_dtype`) @ an 8-bit w [K, N] * w_scale [N]:
    `whole_k_call` of a `quantizing_kernel`, cached across N wherever N's blocks run in sequence
    (`x_chains`): x spans several M blocks (M kept parallel for megacore chips), or one M block and
    `bs.x_chains` chains of N blocks. With one chain per M block and `bs.stream_chunks` set, the kernel
    copies x and the weight tiles itself where the blocks allow it (`quant_streamed`). Shared by w8a8 and
    fp8_matmul's fp8 mode."""
    chains = x_chains(bs, x.shape[0], w.shape[1])

    def scratch(bm, bn, k):  # x's f32 copy and its quantization (kept, with its scales, where cached),
        # the accumulator and its f32 copy (a chunked first block holds one more partial product at
        # its peak, within vmem_limit's headroom: every chunked row compiled)
        return block_bytes((bm, k), 4) + 2 * block_bytes((bm, k), 1) + block_bytes((bm, 1), 4) + \
            2 * block_bytes((bm, bn), 4)

    k_chunks = QUANT_CHUNKS if chains and x.shape[0] < PREFILL_M else 1
    if chains == 1 and streams(bs, *x.shape, w.shape[1], k_chunks):
        return streamed_call(quantize, qmax, quant_dtype, acc_dtype, x, w, w_scale, bs, quant_chunks=k_chunks,
                             name=name, interpret=interpret)
    kernel = quantizing_kernel(quantize, qmax, acc_dtype, cached=chains > 0, k_chunks=k_chunks)
    return whole_k_call(kernel, x, w, w_scale, bs,
                        scratch=scratch, name=name, interpret=interpret, chains=chains,
                        scratch_shapes=_x_cache(quant_dtype) if chains else None)


def _x_cache(quant_dtype):
    """A cached `quantizing_kernel`'s VMEM scratch: x's quantized rows and their scales."""
    return lambda bm, bn, k: [pltpu.VMEM((bm, k), quant_dtype), pltpu.VMEM((bm, 1), jnp.float32)]


def several_m_blocks(bs: BlockSizes, m: int) -> bool:
    """Whether x [M, K] spans more than one M block: where a kernel may cache what it made of x (or
    of a weight tile) across the other grid axis and keep the M axis parallel for megacore chips."""
    return fit_block(bs.block_m, m) < m


def x_chains(bs: BlockSizes, m: int, n: int) -> int:
    """How many sequential chains of N blocks a quantizing kernel runs, quantizing x once per chain
    (0: every grid step quantizes its x block). Several M blocks: one chain per M block (M parallel).
    One M block: `bs.x_chains` where the N blocks split evenly into that many. On v5e at M256 K4096
    N14336 (e4m3), x quantized at each of the 7 N blocks of 2048 took 293.8k cycles; one chain of
    N blocks of 512, x quantized whole once, 247.4k; two chains 253.0k (x quantized twice). Both
    chained figures are from before `QUANT_CHUNKS`."""
    if several_m_blocks(bs, m):
        return 1
    c = bs.x_chains
    return c if c and pl.cdiv(n, fit_block(bs.block_n, n)) % c == 0 else 0


def whole_k_call(kernel, x, w, w_scale, bs: BlockSizes, *, scratch, name: str, interpret: bool,
                 n_outer: bool = False, chains: int = 0, scratch_shapes: Callable | None = None):
    """`kernel(x_ref, w_ref, s_ref, o_ref, *scratch_refs)` over the output tiles with the whole K in
    each block: x [M, K] @ an 8-bit w [K, N] * w_scale [N] -> [M, N] in x's dtype. The grid is (i over
    M, j over N), or with `n_outer` (j over N, i over M, the inner axis sequential: a kernel may keep
    what it made of its weight tile in `scratch_shapes(bm, bn, k)` across the M blocks), or with
    `chains` >= 1 (i over M, j over N sequential: a kernel may keep what it made of x's block across
    the N blocks, as `quantizing_kernel` does; with one M block, the N blocks as `chains` sequential
    chains, the chains parallel, `chains` dividing their count). `scratch(bm, bn, k)` is the VMEM the kernel's
    temporaries take. Shared by the 8-bit matmuls (this one, fp8_matmul)."""
    m, k = x.shape
    n = w.shape[1]
    bm, bn = fit_block(bs.block_m, m), fit_block(bs.block_n, n)
    gm, gn = pl.cdiv(m, bm), pl.cdiv(n, bn)
    xb = jnp.dtype(x.dtype).itemsize
    # The pipeline skips a copy whose block index did not change since the step before. With j
    # inner, x's block (i, 0) keeps its index across it (x read once) and w's (0, j) changes every
    # step (w read once per M block unless N is one block); with i inner, the other way round.
    if n_outer:
        x_reads, w_reads = (1 if gm == 1 else gn), 1
    else:
        x_reads, w_reads = 1, (1 if gn == 1 else gm)
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=int(x_reads * m * k * xb + w_reads * (k * n + 4 * n) + m * n * xb))
    # Blocks: x, w, the scales and the output, pipelined.
    blocks = (block_bytes((bm, k), xb) + block_bytes((k, bn), 1) + block_bytes((1, bn), 4)
              + block_bytes((bm, bn), xb))
    if n_outer:
        grid, order = (gn, gm), (lambda f: lambda j, i: f(i, j))
        semantics = ("parallel", "arbitrary")
    else:
        grid, order = (gm, gn), (lambda f: f)
        semantics = ("parallel", "arbitrary" if chains else "parallel")
        if chains and gm == 1:  # chains of N blocks: c picks the chain, j steps along it
            if gn % chains:
                raise ValueError(f"{chains} chains do not split {gn} N blocks evenly")
            per = gn // chains
            grid, order = (chains, per), (lambda f: lambda c, j: f(0, c * per + j))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=grid,
        in_specs=[pl.BlockSpec((bm, k), order(lambda i, j: (i, 0))),
                  pl.BlockSpec((k, bn), order(lambda i, j: (0, j))),
                  pl.BlockSpec((1, bn), order(lambda i, j: (0, j)))],
        out_specs=pl.BlockSpec((bm, bn), order(lambda i, j: (i, j))),
        scratch_shapes=scratch_shapes(bm, bn, k) if scratch_shapes else (),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics,
                                             vmem_limit_bytes=vmem_limit(blocks, scratch(bm, bn, k))),
        cost_estimate=cost,
        interpret=interpret,
        name=name,
    )(x, w, w_scale.reshape(1, n).astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def w8a8_matmul(x, w, w_scale, *, block_sizes: BlockSizes | None = None, interpret=False):
    """x [M, K] (bf16 or f32) quantized per token, @ w int8 [K, N] * w_scale f32 [N] -> [M, N] in
    x's dtype. Any M and N; K is one block."""
    _check_shapes(x, w, w_scale)

    return quantized_x_call(quantize_rows, _QMAX, jnp.int8, jnp.int32, x, w, w_scale,
                            block_sizes or default_blocks(x.shape[0]), name="tpudiag_w8a8_matmul",
                            interpret=interpret)


def reference(x, w, w_scale, *, block_sizes=None):
    """Pure JAX. The quantization is the op's own definition, in f32 as the kernel and a serving
    stack do it (`quantize_rows`): a float64 run must not move an element across a rounding
    boundary, which with outlier channels changes an output by a whole quantum. The integer sums
    and the scaling run in x's compute dtype (f32, or f64 under x64), exact there (|sum| < 127^2 *
    K < 2^53). `block_sizes` is accepted and ignored."""
    ct = jnp.promote_types(x.dtype, jnp.float32)
    xq, sx = quantize_rows(x)
    acc = jnp.dot(xq.astype(ct), w.astype(ct), precision=jax.lax.Precision.HIGHEST)
    return (acc * sx.astype(ct) * w_scale.astype(ct)[None, :]).astype(x.dtype)


def xla_w8a8_matmul(x, w, w_scale):
    """What users write without a kernel (the w8a8 path of a JAX serving stack): quantize the
    activations per token, an int8 dot with int32 accumulation, both scales after."""
    xq, sx = quantize_rows(x)
    acc = jax.lax.dot(xq, w, preferred_element_type=jnp.int32)
    return (acc.astype(jnp.float32) * sx * w_scale[None, :]).astype(x.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(m, k, n, dtype, zero_row=False, outlier=False):
    def make_args(key):
        kx, kw, ks = jax.random.split(key, 3)
        x = jax.random.normal(kx, (m, k), jnp.float32)
        if outlier:  # activation outliers (a few channels 50x larger), what per-token scales face
            x = x.at[:, :: max(1, k // 8)].multiply(50.0)
        if zero_row:
            x = x.at[m // 2].set(0.0)
        w = jax.random.randint(kw, (k, n), -127, 128, jnp.int32).astype(jnp.int8)
        # per-channel scales of N(0, 1/K) weights quantized symmetrically, +-50% across channels
        base = 3.0 / (127.0 * (k ** 0.5))
        w_scale = base * jax.random.uniform(ks, (n,), jnp.float32, 0.5, 1.5)
        return x.astype(dtype), w, w_scale

    return make_args


def cases() -> list[Case]:
    """Blocks 32 x 128 so the grid has several steps in M and N, with edge blocks in both."""
    bs = dict(block_sizes=BlockSizes(block_m=32, block_n=128))
    return [
        Case("ragged M N f32", _make(50, 256, 300, jnp.float32), bs, "float32"),
        Case("ragged M N bf16", _make(50, 256, 300, jnp.bfloat16), bs, "bfloat16"),
        Case("decode M=8, a zero row, bf16", _make(8, 512, 384, jnp.bfloat16, zero_row=True), bs, "bfloat16"),
        Case("outlier channels bf16", _make(64, 512, 256, jnp.bfloat16, outlier=True), bs, "bfloat16"),
        # one M block in two chains of N blocks: K in QUANT_CHUNKS chunks of 128 at each chain's first
        # block, each row's scale from its whole row, the outliers in some chunks only
        Case("one M block, x quantized in chunks of K, outlier channels f32",
             _make(50, 2048, 512, jnp.float32, outlier=True),
             dict(block_sizes=BlockSizes(block_m=64, block_n=128, x_chains=2)), "float32"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-3, rtol=1e-3, reason=(
        "both sides quantize the same values the same way, in f32 (the op's definition, float64 runs "
        "included) and the int32 sums are exact; what differs is the f32 rounding of the scaling")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "bf16 output (2^-8 relative rounding) of O(1) values; the quantization itself is computed in "
        "f32 from the same bf16 inputs on both sides")),
}


# ----------------------------------------------------------------------------- bench

def _args(m: int, p: dict = PROD):
    sds = jax.ShapeDtypeStruct
    return (sds((m, p["k"]), jnp.bfloat16), sds((p["k"], p["n"]), jnp.int8), sds((p["n"],), jnp.float32))


def bench(blocks: BlockSizes | None = None, m: int | None = None, shape: dict | None = None) -> BenchSetup:
    """At the decode shape by default (M 64); `m=2048` gives a prefill chunk; `shape` replaces K and
    N (another projection: {"k": 8192, "n": 3584})."""
    p = at_shape(PROD, shape)
    m = m or p["m_decode"]
    blocks = blocks or default_blocks(m)

    def kernel(x, w, w_scale):
        return w8a8_matmul(x, w, w_scale, block_sizes=blocks)

    return BenchSetup(shape=f"M{m} K{p['k']} N{p['n']} x bf16 (int8 per token), w int8, scales f32",
                      args=_args(m, p), kernel=kernel, xla=xla_w8a8_matmul, blocks=str(blocks))


SPEC = KernelSpec(
    name="w8a8_matmul",
    title="W8A8 matmul: activations quantized per token in VMEM, int8 x int8 on the MXU, both scales on the output",
    replaces=("XLA quantizes the activations in a fusion of its own (x read, int8 x and its scales written "
              "to HBM and read back by the int8 dot); the kernel quantizes each block in VMEM."),
    signature="w8a8_matmul(x, w, w_scale, *, block_sizes=None, interpret=False)",
    tuned_for=("decode M64 K4096 N14336 (x bf16, w int8, w_scale f32); a prefill chunk (M >= 2048) in M blocks "
               "of 512"),
    usage=("from tpudiag.kernels.w8a8_matmul import w8a8_matmul\n"
           "y = w8a8_matmul(x, w_int8, w_scale)  # x [M,K] bf16, w [K,N] int8, w_scale [N] f32 -> [M,N] bf16"),
    kernel=w8a8_matmul,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(256, 2048), BlockSizes(64, 512), BlockSizes(64, 2048), BlockSizes(256, 512),
                      BlockSizes(256, 1024), BlockSizes(512, 1024)),
    differentiable=False,
)
