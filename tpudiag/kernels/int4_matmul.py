"""Int4 weight-only matmul with group scales, for serving: x [M, K] (bf16 or f32) times int4 weights
w [K, N] (`jnp.int4`, two to a byte in HBM) with one scale per group of G consecutive rows of K
and per output channel, scales [K / G, N].

    out[m, n] = sum_k x[m, k] * (w[k, n] * scales[k // G, n])        in x's dtype, f32 accumulation

This is what a GPTQ/AWQ-style int4 checkpoint (symmetric, groups of 128 along K) computes. Without a
kernel the TPU compiler (libtpu 0.0.42 and 0.0.50, v5e and v6e) broadcasts the group scales to the
weights' whole shape in bf16, writes that to HBM (4x the int4 weights' bytes) and reads it back in
the dot's fusion. Here each grid step converts one [block_k, block_n] weight tile
to x's dtype in VMEM, applies its block_k / G group scales (one broadcast multiply over a [groups,
G, block_n] view), and accumulates its matmul in an f32 scratch over the K steps. K is blocked
(the dequantized tile of all K would not fit VMEM at N blocks wide enough to keep the weight DMAs
long); block_k is a multiple of G, so a step's groups are whole. Edge blocks in M and N need no
masking (rows and columns past the array are dropped when the block is written); K must be a
multiple of the K block. No gradient: this is an inference kernel.

At a few rows of bf16 x (M <= 16: decode at small batches) the conversion of every weight to bf16
is most of the kernel's time, and the MXU has little else to do. There the kernel converts nothing:
each row of x is split exactly into three int8 digits at power-of-two scales (x = d1 s1 + d2 s2 +
d3 s3, 7 bits a digit), the digit rows are multiplied by the int8 weights on the MXU's int8 path
(int32 sums, exact), and each group's sums are scaled by the group scales and the digit scales in
f32 (`int4_digits_kernel`). A bf16 x (8 significant bits) is exact in the three digits down to
2^-12 of its row's largest magnitude; below that the error is at most 2^-20 of it.

Holds the kernel, the pure-JAX reference, the plain-JAX version users write, and the `SPEC`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape
from tpudiag.kernels.tiling import (balanced_block, block_bytes, check_matmul_operands, check_multiples, fit_block,
                                    mxu_precision, vmem_limit)

# Production shape: Llama 3 8B's MLP up/gate projection (K 4096 -> N 14336), groups of 128 along K;
# decode M 64 tokens, prefill chunks M 2048.
PROD = dict(m_decode=64, m_prefill=2048, k=4096, n=14336, group=128)


@dataclass(frozen=True)
class BlockSizes:
    """Output tile per grid step (block_m x block_n) and the K block of each accumulation step.
    block_m is a multiple of 16 (bf16 sublanes), block_n of 128 (lanes), block_k of 128 and of the
    group size. A dimension smaller than its block is taken whole; N is split into even blocks of
    at most block_n (`tiling.balanced_block`)."""

    block_m: int = 256
    block_n: int = 1024
    block_k: int = 4096

    def __post_init__(self):
        check_multiples(self, (("block_m", 16), ("block_n", 128), ("block_k", 128)))

    def __str__(self) -> str:
        return f"block_m={self.block_m}, block_n={self.block_n}, block_k={self.block_k}"


# `tpudiag kernels tune int4_matmul` at decode M64: the whole K in one block and N blocks of 1024
# rank first on both targets (v5e 76.6k cycles, v6e 67.3k); N 2048 x K 1024 is 1.15x / 1.08x and
# N 2048 x K 2048 1.04x / 1.03x. N 2048 with all of K is not a candidate: its f32 dequantized tile
# alone would be 32 MiB of VMEM.
DEFAULT_BLOCKS = BlockSizes(block_m=256, block_n=1024, block_k=4096)
# A prefill chunk (M >= 2048) in M blocks of 512, as w8a8_matmul: the weights are read half as often.
# On v6e at K4096 N14336, M2048 0.82x -> 0.66x XLA, M8192 to its compute floor (bench/sweep_serving.py).
# N blocks of up to 2048: where K takes two blocks x is fetched again for every N block, so fewer N
# blocks read it less often. Llama 3 70B's projection at TP8 (K8192 N3584, M2048): N blocks of 1024
# (4, the last half empty) 297.6k cycles on v6e and 1.09M on v5e; two of 1792 256.6k and 948k.
# At 8B's K4096 N14336: v6e 501.3k -> 489.9k.
PREFILL_M = 2048
PREFILL_BLOCKS = BlockSizes(block_m=512, block_n=2048, block_k=4096)


# Rows of bf16 x up to which the kernel multiplies x's int8 digits by the int8 weights instead of
# converting the weights (`int4_digits_kernel`). Llama 3 8B's up projection (K4096 N14336, groups of
# 128): v6e 64.1k -> 35.6k cycles at M1 and 64.2k -> 41.8k at M16; v5e 72.3k -> at its HBM floor
# (57.2k) at M1 and 72.9k -> 62.7k at M16. At M32 the per-group scaling of 3 x 32 digit rows costs
# more than the conversion it saves on v5e (79.0k against 74.1k).
DIGITS_MAX_M = 16
# The digit kernel's blocks: N blocks of up to 2048 (its tiles hold no converted weights, so wide ones
# fit). At M1 the kernel is HBM-bound, and the fewer, longer weight DMAs come closer to the floor:
# v6e 8B (N 14336) 35.7k -> 34.6k cycles (floor 33.4k), 70B at TP8 (N 3584) 20.7k -> 18.7k; M16
# 41.8k -> 40.7k and 23.4k -> 22.7k; v5e M16 63.3k -> 60.0k, M1 at its floor either way.
DIGITS_BLOCKS = BlockSizes(block_m=16, block_n=2048, block_k=4096)


def takes_digits(dtype, m: int) -> bool:
    """Whether x [M, K] of `dtype` goes through the int8-digit kernel: bf16 of at most `DIGITS_MAX_M` rows."""
    return jnp.dtype(dtype) == jnp.bfloat16 and m <= DIGITS_MAX_M


def default_blocks(m: int, dtype=jnp.bfloat16) -> BlockSizes:
    """The blocks `block_sizes=None` takes for x [M, K] of `dtype`."""
    if takes_digits(dtype, m):
        return DIGITS_BLOCKS
    return PREFILL_BLOCKS if m >= PREFILL_M else DEFAULT_BLOCKS


def _check_shapes(x, w, scales):
    check_matmul_operands(x, w, jnp.int4)
    k, n = w.shape
    if scales.ndim != 2 or scales.shape[1] != n or scales.shape[0] == 0 or k % scales.shape[0]:
        raise ValueError(f"scales must be [K / G, N={n}] with G dividing K={k}, got {scales.shape}")


def _n_block(block_n: int, n: int) -> int:
    """The N block the call takes: N in even blocks of at most block_n (`balanced_block`), so 70B's N
    3584 at TP8 in blocks of 1024 goes in 4 of 896 rather than computing 4096 columns."""
    return balanced_block(block_n, n, 128)


def _k_block(block_k: int, k: int, group: int) -> int:
    """The K block: the whole K if it fits the requested block, else the largest multiple of
    lcm(group, 128) that divides K and is at most block_k (K steps must be whole: no masking in the
    contraction)."""
    if block_k >= k:
        return k
    step = group * 128 // _gcd(group, 128)
    best = 0
    for b in range(step, block_k + 1, step):
        if k % b == 0:
            best = b
    if not best:
        raise ValueError(f"no K block of at most {block_k} is a multiple of {step} (groups of {group}, "
                         f"128 lanes) dividing K={k}")
    return best


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def int4_kernel(x_ref, w_ref, s_ref, o_ref, acc_ref, *, group: int):
    """Grid (i over M, j over N, l over K blocks): dequantize this [bk, bn] weight tile in x's dtype
    with its bk / G group scales, accumulate x_tile @ w_tile in f32, write on the last K step."""
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    dt = x_ref.dtype
    bk, bn = w_ref.shape
    # int4 -> int8 -> f32: libtpu's static profile aborts on a direct int4 -> bf16 unpack (an LLO
    # type check, libtpu 0.0.42 and 0.0.50), and the group scales multiply in f32 either way.
    w = w_ref[...].astype(jnp.int8).astype(jnp.float32).reshape(bk // group, group, bn)
    sc = s_ref[...].astype(jnp.float32)
    if sc.ndim == 2:  # [groups, bn]; the [groups, 1, bn] layout arrives as is
        sc = sc[:, None, :]
    w = (w * sc).reshape(bk, bn).astype(dt)
    acc_ref[...] += jnp.dot(x_ref[...], w, precision=mxu_precision(w), preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _done():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _digits(x, n: int = 3):
    """x [rows, K] f32 as n int8 digit rows [n * rows, K] and their scales (n arrays [rows, 1]):
    x = sum_i d_i * s_i with s_1 the power of two that puts the row's largest magnitude below 64 and
    s_(i+1) = s_i / 128, so every digit is in [-64, 64] and every step is exact in f32."""
    amax = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    # amax's exponent field e: amax < 2^(e - 126), so s_1 = 2^(e - 132) keeps |x / s_1| < 64. A
    # floor on e keeps the last scale a normal f32 (a row of zeros gets digits of zero).
    i32 = jnp.int32
    e = jnp.maximum(lax.shift_right_logical(lax.bitcast_convert_type(amax, i32), i32(23)), i32(20))
    scales = [lax.bitcast_convert_type(lax.shift_left(e - i32(5 + 7 * i), i32(23)), jnp.float32) for i in range(n)]
    digits, r = [], x
    for sc in scales:
        d = jnp.floor(r / sc + 0.5)
        r = r - d * sc
        digits.append(d)
    return jnp.concatenate(digits, axis=0).astype(jnp.int8), scales


def int4_digits_kernel(x_ref, w_ref, s_ref, o_ref, acc_ref, *, group: int):
    """`int4_kernel` for a few rows of bf16 x: x's three int8 digit rows times this step's int4
    weights (unpacked to int8, not converted) on the int8 MXU path, one dot a group, each group's
    int32 sums scaled by its group scales into f32; the digits' scales applied once a step."""
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    bm = x_ref.shape[0]
    bk, bn = w_ref.shape
    digits, dscale = _digits(x_ref[...].astype(jnp.float32))
    w = w_ref[...].astype(jnp.int8)
    sc = s_ref[...].astype(jnp.float32)
    if sc.ndim == 3:  # the [groups, 1, bn] layout
        sc = sc[:, 0, :]
    acc = jnp.zeros((len(dscale) * bm, bn), jnp.float32)
    for g in range(bk // group):
        cols = slice(g * group, (g + 1) * group)
        part = jnp.dot(digits[:, cols], w[cols], preferred_element_type=jnp.int32)
        acc = acc + part.astype(jnp.float32) * sc[g:g + 1]
    acc_ref[...] += sum(acc[i * bm:(i + 1) * bm] * ds for i, ds in enumerate(dscale))

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _done():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def int4_matmul(x, w, scales, *, block_sizes: BlockSizes | None = None, interpret=False):
    """x [M, K] (bf16 or f32) @ (w int4 [K, N] * scales [K / G, N] per group of G rows) -> [M, N] in
    x's dtype. Any M and N; K a multiple of the K block (`_k_block`). bf16 x of at most
    `DIGITS_MAX_M` rows takes the int8-digit kernel (x must be finite there)."""
    _check_shapes(x, w, scales)
    m, k = x.shape
    digits = takes_digits(x.dtype, m)
    bs = block_sizes or default_blocks(m, x.dtype)
    n = w.shape[1]
    groups = scales.shape[0]
    group = k // groups
    bm, bn, bk = fit_block(bs.block_m, m), _n_block(bs.block_n, n), _k_block(bs.block_k, k, group)
    gm, gn, gk = pl.cdiv(m, bm), pl.cdiv(n, bn), k // bk
    xb = jnp.dtype(x.dtype).itemsize
    sb = jnp.dtype(scales.dtype).itemsize
    # x's block (i, l) is re-fetched for every N block unless K is one block (then its index stays
    # (i, 0) across j); w's and the scales' (l, j) for every M block (a block index that does not
    # change between consecutive steps is not fetched again).
    x_reads = 1 if gk == 1 else gn
    w_reads = 1 if gm == 1 or (gn == 1 and gk == 1) else gm
    cost = pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                           bytes_accessed=int(x_reads * m * k * xb + w_reads * (k * n // 2 + groups * n * sb)
                                              + m * n * xb))
    # Blocks: x, w (int4, counted at a byte: Mosaic's tiles pack 2 a byte but pad as int8 does),
    # the scales and the output, pipelined; the f32 accumulator; temporaries made on purpose: the
    # f32 product before it is added, the f32 dequantized tile and its copy in x's dtype.
    # The scales' block is [bk / G, bn] where that is a legal block (a multiple of 8 rows, or all of
    # them); otherwise the scales go in as [K / G, 1, N] (a unit middle dim is the array's own, so
    # any count of rows is legal), at the cost of a relayout before the call.
    flat = (bk // group) % 8 == 0 or bk == k
    s_block = (bk // group, bn) if flat else (bk // group, 1, bn)
    blocks = (block_bytes((bm, bk), xb) + block_bytes((bk, bn), 1) + block_bytes(s_block, sb)
              + block_bytes((bm, bn), xb))
    if digits:  # the accumulator, the int8 weight tile, the digits' f32 sums and their product
        scratch = block_bytes((bm, bn), 4) + block_bytes((bk, bn), 1) + block_bytes((3 * bm, bn), 4) * 2
    else:
        scratch = block_bytes((bm, bn), 4) * 2 + block_bytes((bk, bn), 4) + block_bytes((bk, bn), xb)
    return pl.pallas_call(
        functools.partial(int4_digits_kernel if digits else int4_kernel, group=group),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(gm, gn, gk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, l: (i, l)),
                  pl.BlockSpec((bk, bn), lambda i, j, l: (l, j)),
                  pl.BlockSpec(s_block, (lambda i, j, l: (l, j)) if flat else (lambda i, j, l: (l, 0, j)))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, l: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit(blocks, scratch)),
        cost_estimate=cost,
        interpret=interpret,
        name="tpudiag_int4_matmul",
    )(x, w, scales if flat else scales.reshape(groups, 1, n))


def dequantize(w, scales, dtype):
    """w int4 [K, N] * scales [K / G, N], each scale over its group of G rows, in `dtype`."""
    k, n = w.shape
    groups = scales.shape[0]
    wd = w.astype(dtype).reshape(groups, k // groups, n) * scales.astype(dtype)[:, None, :]
    return wd.reshape(k, n)


def reference(x, w, scales, *, block_sizes=None):
    """Pure JAX in x's compute dtype (f32, or f64 under x64): dequantize, then one matmul at the
    highest precision. `block_sizes` is accepted and ignored."""
    ct = jnp.promote_types(x.dtype, jnp.float32)
    return jnp.dot(x.astype(ct), dequantize(w, scales, ct), precision=jax.lax.Precision.HIGHEST).astype(x.dtype)


def xla_int4_matmul(x, w, scales):
    """What users write without a kernel (a JAX serving stack's int4 path): dequantize the weights
    in the activations' dtype, then the matmul with f32 accumulation."""
    return jnp.dot(x, dequantize(w, scales, x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(m, k, n, group, dtype, zero_group=False):
    def make_args(key):
        kx, kw, ks = jax.random.split(key, 3)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
        w = jax.random.randint(kw, (k, n), -8, 8, jnp.int32).astype(jnp.int4)
        # group scales of N(0, 1/K) weights quantized symmetrically to [-8, 7], +-50% across groups,
        # kept to 5 significant bits: a 4-bit weight times its scale is then exact in bf16, so the
        # kernel's bf16 dequantization rounds nothing and the comparison sees its accumulation and
        # output rounding only (with full f32 scales, that rounding, 2^-9 of each term, is a fixed
        # error of the design that can exceed any elementwise tolerance where a row's terms cancel)
        base = 3.0 / (7.0 * (k ** 0.5))
        scales = base * jax.random.uniform(ks, (k // group, n), jnp.float32, 0.5, 1.5)
        mant, exp = jnp.frexp(scales)
        scales = jnp.ldexp(jnp.round(mant * 32.0) / 32.0, exp)
        if zero_group:  # a group whose weights were all zero: a zero scale
            scales = scales.at[0].set(0.0)
        return x, w, scales

    return make_args


def cases() -> list[Case]:
    """Blocks 16 x 128 x 128 (one group of 128, or two of 64, per K step) so the grid has several
    steps in M, N and K, with edge blocks in M and N. bf16 x of at most 16 rows takes the int8-digit
    kernel."""
    bs = dict(block_sizes=BlockSizes(block_m=16, block_n=128, block_k=128))
    whole_k = dict(block_sizes=BlockSizes(block_m=16, block_n=128, block_k=512))
    return [
        Case("ragged M N, groups of 128, f32", _make(40, 512, 300, 128, jnp.float32), bs, "float32"),
        Case("ragged M N, groups of 128, bf16", _make(40, 512, 300, 128, jnp.bfloat16), bs, "bfloat16"),
        Case("decode M=8, groups of 64, whole K, a zero group, bf16 (int8 digits)",
             _make(8, 512, 256, 64, jnp.bfloat16, zero_group=True), whole_k, "bfloat16"),
        Case("decode M=3, K in 4 steps, ragged N, bf16 (int8 digits)", _make(3, 512, 300, 128, jnp.bfloat16), bs,
             "bfloat16"),
        Case("per-channel (one group), bf16", _make(32, 256, 256, 256, jnp.bfloat16), whole_k, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-4, reason=(
        "the dequantized weights are exact in f32 (a 4-bit integer times an f32 scale, rounded once); "
        "the f32 accumulation runs in another order over K blocks (MXU passes at f32)")),
    "bfloat16": Tolerance(atol=3e-2, rtol=3e-2, reason=(
        "the output is bf16 (2^-9 relative) of O(1) values summed over K up to 512 in f32; the verify "
        "cases' scales have 5 significant bits, so each dequantized weight is exact in bf16 (with full "
        "f32 scales the kernel, as the plain-JAX version, rounds it to bf16: 2^-9 of each term, which "
        "a row whose terms cancel can carry past any elementwise bound); the int8-digit kernel's sums "
        "are exact to 2^-20 of the row's largest |x| before the output rounding")),
}


# ----------------------------------------------------------------------------- bench

def _args(m: int, p: dict = PROD):
    sds = jax.ShapeDtypeStruct
    k, n, g = p["k"], p["n"], p["group"]
    return sds((m, k), jnp.bfloat16), sds((k, n), jnp.int4), sds((k // g, n), jnp.float32)


def bench(blocks: BlockSizes | None = None, m: int | None = None, shape: dict | None = None) -> BenchSetup:
    """At the decode shape by default (M 64); `m=2048` gives a prefill chunk; `shape` replaces K, N
    and the group size."""
    p = at_shape(PROD, shape)
    m = m or p["m_decode"]
    blocks = blocks or default_blocks(m)

    def kernel(x, w, scales):
        return int4_matmul(x, w, scales, block_sizes=blocks)

    bn = _n_block(blocks.block_n, p["n"])  # the N blocks the call cuts, shown where they differ
    shown = str(blocks) if bn == fit_block(blocks.block_n, p["n"]) else f"{blocks} (N in blocks of {bn})"
    return BenchSetup(shape=f"M{m} K{p['k']} N{p['n']} x bf16, w int4, groups of {p['group']} f32",
                      args=_args(m, p), kernel=kernel, xla=xla_int4_matmul, blocks=shown)


SPEC = KernelSpec(
    name="int4_matmul",
    title="Int4 weight-only matmul with group scales: each weight tile dequantized in VMEM, f32 accumulation over K",
    replaces=("XLA writes the group scales broadcast to the weights' whole shape (bf16, 4x the int4 bytes) to "
              "HBM and reads them back in the dot; the kernel streams int4 tiles and dequantizes each in VMEM."),
    signature="int4_matmul(x, w, scales, *, block_sizes=None, interpret=False)",
    tuned_for=("decode M64 K4096 N14336, groups of 128 (x bf16, w int4, scales f32); a prefill chunk "
               "(M >= 2048) in M blocks of 512 and N blocks of up to 2048; M <= 16 of bf16 x as int8 digits on "
               "the int8 MXU path, N blocks of up to 2048; N split into even blocks"),
    usage=("from tpudiag.kernels.int4_matmul import int4_matmul\n"
           "y = int4_matmul(x, w_int4, scales)  # x [M,K] bf16, w [K,N] jnp.int4, scales [K/128,N] f32 -> [M,N] bf16"),
    kernel=int4_matmul,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(256, 1024, 4096), BlockSizes(256, 2048, 2048), BlockSizes(256, 512, 4096),
                      BlockSizes(256, 2048, 1024), BlockSizes(256, 1024, 1024), BlockSizes(256, 2048, 512)),
    differentiable=False,
)
