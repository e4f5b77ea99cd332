"""FP8 matmul for serving: weights w [K, N] stored as float8_e4m3fn with per-output-channel scales
[N], times x [M, K] (bf16), in one of two modes:

    activations="fp8"  (default: an fp8 checkpoint served with dynamic per-token activation scales)
        sx[m]     = max_k |x[m, k]| / 448          (per-token scale; a zero row keeps scale 1)
        xq[m, k]  = e4m3(clip(x[m, k] / sx[m], +-448))
        out[m, n] = (sum_k xq[m, k] * w[k, n]) * sx[m] * w_scale[n]       e4m3 x e4m3 -> f32 on the MXU
    activations="bf16" (weight-only: x keeps its precision)
        out[m, n] = (sum_k x[m, k] * bf16(w[k, n])) * w_scale[n]          bf16 x bf16 -> f32

Which chips multiply e4m3 on the MXU is the chip table's `peak_fp8_flops_per_s`: v5e (measured),
v5p and v6e at their bf16 rate, TPU7x at twice it; v4's MXU takes no fp8 operand (Mosaic:
"Unsupported matmul RHS type"), so only the weight-only mode can run there. Every e4m3 value is exact in bf16, so the
weight-only mode loses nothing to its upcast, but the upcast is VPU work on every weight.

Without a kernel XLA quantizes the activations in a fusion of their own (x read, xq and its scales
written to HBM and read back by the dot) or upcasts the weights in one. Here x's rows are quantized
(or each weight tile converted) in VMEM: once per M block where the N blocks run in sequence
(several M blocks, or `x_chains`), else at each grid step. The whole K is one block (a token's
scale needs its whole row). Edge blocks in M and N need no masking: rows and columns past the
array are computed from unspecified values and dropped when the block is written. e4m3fn has no
infinity and converts an out-of-range value to NaN, so the quantization clips first. No gradient:
an inference kernel.

Holds the kernel, the pure-JAX reference, the plain-JAX version users write, and the `SPEC`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape
from tpudiag.kernels.tiling import block_bytes, check_matmul_operands, dot_by_exact_weights, exact_weights_scratch
from tpudiag.kernels.w8a8_matmul import (PREFILL_M, BlockSizes, default_blocks, quantized_x_call, row_scales,
                                         several_m_blocks, whole_k_call)

# Production shape: Llama 3 8B's MLP up/gate projection (K 4096 -> N 14336), as the other quantized
# matmuls; decode M 64 tokens.
PROD = dict(m_decode=64, k=4096, n=14336)
FP8 = jnp.float8_e4m3fn
_FMAX = 448.0  # the largest finite e4m3fn value
MODES = ("fp8", "bf16")


DEFAULT_BLOCKS = BlockSizes()
# The fp8 mode on v5e below a prefill chunk: x quantized once (one chain of N blocks, its first block
# quantizing in chunks of K as it multiplies: w8a8_matmul.QUANT_CHUNKS), x and the weight tiles copied by
# the kernel, the first tile and x in 4 chunks of K (`stream_chunks`), N blocks of 896 (even blocks of
# Llama 3 8B's N 14336 and of 70B's 3584 at tensor parallelism 8). 8B's up projection at M 256: 240.7k
# cycles; with the pipeline's copies 244.1k (248.2k with x quantized whole first), against 293.8k with
# the default blocks (x quantized again at each of the 7 N blocks). Other N blocks at M 256 with the
# kernel's copies: 512 243.4k, 1024 240.3k, 1792 241.0k; 896 is kept as 70B's N 3584 splits into it.
# M 512: 479.6k. 70B's at M 64: 57.7k against 77.3k. On v6e libtpu's static profile aborts on
# the fp8 kernel in either form (LLO type checks), so its figures there are floors and cannot tell
# the blocks apart: only v5e, where it was measured, takes these. Measured with every loop stepped
# through: with fast-forwarded loops (suggest's static profile) the chained grid reads 243k at M 64,
# not 112.0k.
V5E_FP8_BLOCKS = BlockSizes(block_m=256, block_n=896, x_chains=1, stream_chunks=4)


def _check(x, w, w_scale, activations):
    check_matmul_operands(x, w, FP8)
    if w_scale.shape != (w.shape[1],):
        raise ValueError(f"w_scale must be [N={w.shape[1]}], got {w_scale.shape}")
    if activations not in MODES:
        raise ValueError(f"activations must be one of {MODES}, got {activations!r}")


def quantize_rows_fp8(x, scale=None):
    """Per-row symmetric e4m3 quantization in f32: (xq float8_e4m3fn, scale f32 [rows, 1]). A row of
    zeros gets scale 1; values are clipped to +-448 before the convert (e4m3fn has no infinity).
    `scale` given (`row_scales(rows, 448)` of whole rows) quantizes a slice of columns of them."""
    scale = row_scales(x, _FMAX) if scale is None else scale
    xq = jnp.clip(x.astype(jnp.float32) / scale, -_FMAX, _FMAX).astype(FP8)
    return xq, scale


def _weight_only_kernel(x_ref, w_ref, s_ref, o_ref):
    """Grid (i over M, j over N), one M block: the weight tile upcast in VMEM, one matmul over the
    whole K in x's dtype, the channel scales on the f32 result."""
    acc = dot_by_exact_weights(x_ref[...], w_ref[...])  # e4m3 is exact in bf16
    o_ref[...] = (acc * s_ref[...]).astype(o_ref.dtype)


def _weight_only_cached_kernel(x_ref, w_ref, s_ref, o_ref, w_up):
    """Grid (j over N, i over M, i sequential), several M blocks: the weight tile upcast once into
    `w_up` at the first M block and reused by the others (the upcast is VPU work on every weight:
    on v6e, 1.02M cycles against 618k at M2048 when every M block converts its own)."""
    @pl.when(pl.program_id(1) == 0)
    def _():
        w_up[...] = w_ref[...].astype(w_up.dtype)

    acc = dot_by_exact_weights(x_ref[...], w_up[...])
    o_ref[...] = (acc * s_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("activations", "block_sizes", "interpret"))
def fp8_matmul(x, w, w_scale, *, activations: str = "fp8", block_sizes: BlockSizes | None = None,
               interpret=False):
    """x [M, K] (bf16 or f32) @ w float8_e4m3fn [K, N] * w_scale f32 [N] -> [M, N] in x's dtype.
    `activations="fp8"` quantizes x per token to e4m3 and multiplies e4m3 on the MXU; "bf16" upcasts
    the weight tile in VMEM (weight-only). Any M and N; K is one block."""
    _check(x, w, w_scale, activations)
    bs = block_sizes or blocks_for(x.shape[0], None, activations)
    name = f"tpudiag_fp8_matmul_{activations}"
    if activations == "fp8":
        return quantized_x_call(quantize_rows_fp8, _FMAX, FP8, jnp.float32, x, w, w_scale, bs, name=name,
                                interpret=interpret)

    def scratch(bm, bn, k):  # the upcast (bf16) weight tile, the f32 accumulator and its scaled copy,
        # and for f32 x its three bf16 terms and two f32 remainders (tiling.dot_by_exact_weights)
        return block_bytes((k, bn), 2) + 2 * block_bytes((bm, bn), 4) + exact_weights_scratch((bm, k), x.dtype.itemsize)

    if not several_m_blocks(bs, x.shape[0]):  # one M block: nothing to reuse the upcast tile
        return whole_k_call(_weight_only_kernel, x, w, w_scale, bs, scratch=scratch, name=name, interpret=interpret)
    return whole_k_call(_weight_only_cached_kernel, x, w, w_scale, bs, scratch=scratch, name=name,
                        interpret=interpret, n_outer=True,
                        scratch_shapes=lambda bm, bn, k: [pltpu.VMEM((k, bn), jnp.bfloat16)])


def reference(x, w, w_scale, *, activations: str = "fp8", block_sizes=None):
    """Pure JAX. The fp8 mode's quantization is the op's own definition, in f32 as the kernel and a
    serving stack do it (`quantize_rows_fp8`): a float64 run must not move an element across a
    rounding boundary. The products and sums run in x's compute dtype (f32, or f64 under x64).
    `w` may come upcast (a float64 run casts every float input): its values are e4m3's either way.
    `block_sizes` is accepted and ignored."""
    if activations not in MODES:
        raise ValueError(f"activations must be one of {MODES}, got {activations!r}")
    ct = jnp.promote_types(x.dtype, jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    if activations == "fp8":
        xq, sx = quantize_rows_fp8(x)
        acc = jnp.dot(xq.astype(ct), w.astype(ct), precision=hi) * sx.astype(ct)
    else:
        acc = jnp.dot(x.astype(ct), w.astype(ct), precision=hi)
    return (acc * w_scale.astype(ct)[None, :]).astype(x.dtype)


def xla_fp8_matmul(x, w, w_scale, *, activations: str = "fp8"):
    """What users write without a kernel: upcast the fp8 weights and a bf16 dot, or (fp8 mode)
    quantize the activations per token and an fp8 dot with f32 accumulation; the scales after."""
    if activations == "fp8":
        xq, sx = quantize_rows_fp8(x)
        acc = jax.lax.dot(xq, w, preferred_element_type=jnp.float32) * sx
    else:
        acc = jax.lax.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    return (acc * w_scale[None, :]).astype(x.dtype)


# ----------------------------------------------------------------------------- verify cases

def _make(m, k, n, dtype, zero_row=False, outlier=False):
    def make_args(key):
        kx, kw, ks = jax.random.split(key, 3)
        x = jax.random.normal(kx, (m, k), jnp.float32)
        if outlier:  # activation outliers (a few channels 50x larger), what per-token scales face
            x = x.at[:, :: max(1, k // 8)].multiply(50.0)
        if zero_row:
            x = x.at[m // 2].set(0.0)
        # weights of N(0, 1/K) quantized per channel to e4m3: w / w_scale spans +-448
        wf = jax.random.normal(kw, (k, n), jnp.float32) / (k ** 0.5)
        w_scale = jnp.max(jnp.abs(wf), axis=0) / _FMAX
        w = jnp.clip(wf / w_scale, -_FMAX, _FMAX).astype(FP8)
        w_scale = w_scale * jax.random.uniform(ks, (n,), jnp.float32, 0.5, 1.5)  # +-50% across channels
        return x.astype(dtype), w, w_scale

    return make_args


def cases() -> list[Case]:
    """Blocks 32 x 128 so the grid has several steps in M and N, with edge blocks in both; both modes."""
    bs = dict(block_sizes=BlockSizes(block_m=32, block_n=128))
    out = []
    for mode in MODES:
        p = dict(bs, activations=mode)
        out += [
            Case(f"{mode}: ragged M N f32", _make(50, 256, 300, jnp.float32), p, "float32"),
            Case(f"{mode}: ragged M N bf16", _make(50, 256, 300, jnp.bfloat16), p, "bfloat16"),
            Case(f"{mode}: decode M=8, a zero row, bf16", _make(8, 512, 384, jnp.bfloat16, zero_row=True), p,
                 "bfloat16"),
            Case(f"{mode}: outlier channels bf16", _make(64, 512, 256, jnp.bfloat16, outlier=True), p, "bfloat16",
                 tolerance=_OUTLIER_TIES if mode == "fp8" else None),
        ]
    # one M block, its x quantized once per chain of N blocks (two chains of two)
    chained = dict(block_sizes=BlockSizes(block_m=64, block_n=128, x_chains=2), activations="fp8")
    out.append(Case("fp8: one M block, x quantized once a chain, bf16", _make(40, 256, 512, jnp.bfloat16), chained,
                    "bfloat16"))
    out.append(Case("fp8: one M block, x quantized in chunks of K, outlier channels bf16",
                    _make(40, 2048, 512, jnp.bfloat16, outlier=True), chained, "bfloat16", tolerance=_OUTLIER_TIES))
    # two M blocks, each a chain whose kernel copies x and the weight tiles itself (v5e's blocks' path)
    streamed = dict(block_sizes=BlockSizes(block_m=64, block_n=128, stream_chunks=4), activations="fp8")
    out.append(Case("fp8: x and the weight tiles copied by the kernel in chunks, outlier channels bf16",
                    _make(128, 2048, 512, jnp.bfloat16, outlier=True), streamed, "bfloat16", tolerance=_OUTLIER_TIES))
    return out


_OUTLIER_TIES = "bfloat16.fp8-outliers"
TOLERANCES = {
    _OUTLIER_TIES: Tolerance(atol=0.1, rtol=2e-2, reason=(
        "as bfloat16, plus rounding ties of the quantizer: x is quantized to e4m3 (1/16 relative steps) with a "
        "per-token scale amax/448, and an f32 scale one ulp away from float64's (the chip's f32 division) "
        "rounds an outlier (|x| ~ 100) the other way: an output moves by one step of that x times its weight. "
        "Measured on a v5e: 0.062 at K=2048, the reference on the chip the same")),
    "float32": Tolerance(atol=1e-3, rtol=1e-3, reason=(
        "both sides quantize (fp8 mode) the same values the same way in f32, and the e4m3 weights are "
        "exact in any float type; what differs is the f32 accumulation and scaling against float64")),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, reason=(
        "bf16 output (2^-8 relative rounding) of O(1) values; in the weight-only mode the MXU "
        "multiplies bf16 x and exact bf16 weights with an f32 accumulator")),
}


# ----------------------------------------------------------------------------- bench

def _args(m: int, p: dict = PROD):
    sds = jax.ShapeDtypeStruct
    return (sds((m, p["k"]), jnp.bfloat16), sds((p["k"], p["n"]), FP8), sds((p["n"],), jnp.float32))


def blocks_for(m: int, chip=None, activations: str = "fp8") -> BlockSizes:
    """The blocks for x [M, K] on `chip` (None: any, what `block_sizes=None` takes): the fp8 mode takes
    w8a8's (M blocks of 512 from a prefill chunk), and V5E_FP8_BLOCKS on v5e below one; the
    weight-only mode DEFAULT_BLOCKS (it keeps its upcast tile across M blocks)."""
    if activations != "fp8":
        return DEFAULT_BLOCKS
    if getattr(chip, "name", None) == "v5e" and m < PREFILL_M:
        return V5E_FP8_BLOCKS
    return default_blocks(m)


def mode_for(chip) -> str:
    """"fp8" where the chip's MXU multiplies e4m3 (the chip table's `peak_fp8_flops_per_s`), else
    "bf16": weight-only, the only mode that compiles there (v4)."""
    return "fp8" if getattr(chip, "peak_fp8_flops_per_s", None) else "bf16"


def bench(blocks: BlockSizes | None = None, chip=None, activations: str | None = None, m: int | None = None,
          shape: dict | None = None) -> BenchSetup:
    """At the decode shape (M 64) by default, in `activations` mode, by default the target chip's
    (`mode_for`: e4m3 x e4m3 where the MXU takes e4m3; fp8 without a chip). `m` and `shape` (K, N)
    give other shapes."""
    p = at_shape(PROD, shape)
    m = m or p["m_decode"]
    activations = activations or (mode_for(chip) if chip is not None else "fp8")
    blocks = blocks or blocks_for(m, chip, activations)

    def kernel(x, w, w_scale):
        return fp8_matmul(x, w, w_scale, activations=activations, block_sizes=blocks)

    def xla(x, w, w_scale):
        return xla_fp8_matmul(x, w, w_scale, activations=activations)

    what = "x e4m3 per token" if activations == "fp8" else "x bf16, weight-only"
    return BenchSetup(shape=f"M{m} K{p['k']} N{p['n']} ({what}), w e4m3, scales f32", args=_args(m, p),
                      kernel=kernel, xla=xla, blocks=str(blocks))


SPEC = KernelSpec(
    name="fp8_matmul",
    title="FP8 matmul: e4m3 weights with channel scales, activations quantized per token in VMEM (or weight-only)",
    replaces=("XLA upcasts the fp8 weights in a fusion (or, fp8 x fp8, quantizes the activations to HBM and "
              "reads them back for the dot); the kernel converts each weight tile, or quantizes each "
              "activation block, in VMEM."),
    signature="fp8_matmul(x, w, w_scale, *, activations='fp8', block_sizes=None, interpret=False)",
    tuned_for=("decode M64 K4096 N14336 (x bf16, w float8_e4m3fn, w_scale f32); in the fp8 mode a prefill "
               "chunk (M >= 2048) in M blocks of 512, and on v5e below it blocks_for(m, chip): x quantized "
               "once, N blocks of 896, x and the weight tiles copied by the kernel"),
    usage=("from tpudiag.kernels.fp8_matmul import fp8_matmul\n"
           "y = fp8_matmul(x, w_e4m3, w_scale)  # x [M,K] bf16, w [K,N] float8_e4m3fn, w_scale [N] f32 -> [M,N] bf16\n"
           "y = fp8_matmul(x, w_e4m3, w_scale, activations='bf16')  # weight-only: x stays bf16"),
    kernel=fp8_matmul,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=tuple(BlockSizes(256, n) for n in (512, 1024, 2048, 4096)) + (V5E_FP8_BLOCKS,),
    differentiable=False,
    chip_bench=True,
)
