"""RMSNorm with the residual add fused in: one HBM pass forward, one backward.

Reads x [..., D], residual [..., D] and weight [D]; returns (normed, new_residual) where
new_residual = x + residual (stored in x.dtype) and normed = new_residual * rsqrt(mean(new_residual^2) + eps)
* weight, with the statistics in float32. Differentiable (custom_vjp with a Pallas backward kernel that writes
d(new_residual) once, used for both dx and dresidual, and per-block partial sums of dweight).

Does not handle a (1 + weight) offset (Gemma style): pass weight + 1.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, fits_vmem, vmem_limit

# Sublane tiling: a vreg is 8 sublanes x 128 lanes of 32-bit values, or 16 x 128 of packed bf16. Row blocks
# are multiples of 8, and the kernels walk their block in sub-blocks of one vreg row-group (8 rows f32, 16 bf16).
_SUBLANES = 8


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Rows per grid step for the forward and backward kernels (each step holds whole rows of D).

    Whole rows per step because the statistic is a full-row reduction: no cross-step accumulator is needed,
    and the grid axis is "parallel" (megacore chips split it across both TensorCores).
    """

    block_rows: int = 256
    block_rows_bwd: int = 256

    def __post_init__(self):
        for name in ("block_rows", "block_rows_bwd"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
            if v % _SUBLANES:
                raise ValueError(f"{name}={v} must be a multiple of {_SUBLANES} (TPU sublane tiling)")

    def describe(self) -> str:
        return f"block_rows={self.block_rows}, block_rows_bwd={self.block_rows_bwd}"


def _check(x, residual, weight, eps):
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be [..., D] with D >= 1, got shape {x.shape}")
    if residual.shape != x.shape:
        raise ValueError(f"residual shape {residual.shape} must equal x shape {x.shape}")
    if residual.dtype != x.dtype:
        raise ValueError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [D]=[{x.shape[-1]}], got shape {weight.shape}")
    for name, a in (("x", x), ("weight", weight)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise ValueError(f"{name} must be floating point, got {a.dtype}")
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")


def _sub_rows(itemsize: int) -> int:
    return 16 if itemsize == 2 else _SUBLANES  # one packed bf16 vreg holds 16 rows


def _fit_rows(block: int, n: int, d: int, itemsize: int) -> tuple[int, int]:
    """(rows per grid step, rows per inner sub-block).

    A block never exceeds the array: when N is shorter than `block`, the block is N rounded down to whole
    sub-blocks (the remainder becomes a partial last block), or N itself when N < one sub-block (a block equal
    to the full dimension is always a legal tile). The block is then halved until its double-buffered
    streams fit the VMEM rule (tiling.fits_vmem; the inner loop keeps the f32 temporaries to one sub-block)."""
    sub = _sub_rows(itemsize)
    if n < sub:
        return n, n
    rows = min(block, (n // sub) * sub)
    rows = max(sub, rows // sub * sub)
    # four [rows, D] streams (two in, two out), each double-buffered by the Pallas pipeline
    while rows > sub and not fits_vmem(4 * block_bytes((rows, d), itemsize)):
        rows = max(sub, rows // 2 // sub * sub)
    return rows, sub


def _compiler_params(blocks: int, scratch: int = 0):
    """`blocks`, `scratch`: bytes as tiling.vmem_limit takes them."""
    return pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=vmem_limit(blocks, scratch))


# ---------------------------------------------------------------------------------------------- forward


def rmsnorm_fwd_kernel(x_ref, r_ref, w_ref, o_ref, h_ref, *, eps, sub):
    w = w_ref[...].astype(jnp.float32)  # (1, D), broadcast over sublanes

    # One vreg row-group at a time: the f32 temporaries of a whole [rows, D] block would spill to VMEM (at
    # D=4096 they overflow it), while a [sub, D] group stays in the 64-vreg register file or close to it.
    def body(j, carry):
        rs = pl.ds(pl.multiple_of(j * sub, sub), sub)
        # The add is done in f32 and rounded once to the storage dtype: the new residual stream is stored in
        # x.dtype and the statistics are taken from that stored value, exactly as the unfused code does.
        h = (x_ref[rs, :].astype(jnp.float32) + r_ref[rs, :].astype(jnp.float32)).astype(h_ref.dtype)
        h_ref[rs, :] = h
        hf = h.astype(jnp.float32)
        # f32 statistics (a bf16 sum of 4096 squares drifts past 1e-2); the lane reduction runs on the XLU,
        # the rsqrt on the EUP, one per row.
        inv = jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + eps)
        o_ref[rs, :] = (hf * inv * w).astype(o_ref.dtype)
        return carry

    jax.lax.fori_loop(0, x_ref.shape[0] // sub, body, 0)


def _fwd_call(x2, r2, weight, eps, bs: BlockSizes, interpret):
    n, d = x2.shape
    isz = x2.dtype.itemsize
    rows, sub = _fit_rows(bs.block_rows, n, d, isz)
    row_spec = pl.BlockSpec((rows, d), lambda i: (i, 0))
    # The last block may run past N: its extra rows read stale VMEM and their writes are dropped. Rows are
    # independent in the forward pass, so no masking is needed (and no padded copy is made in HBM).
    return pl.pallas_call(
        functools.partial(rmsnorm_fwd_kernel, eps=eps, sub=sub),
        grid=(pl.cdiv(n, rows),),
        in_specs=[row_spec, row_spec, pl.BlockSpec((1, d), lambda i: (0, 0))],  # weight: same block, fetched once
        out_specs=[row_spec, row_spec],
        out_shape=[jax.ShapeDtypeStruct((n, d), x2.dtype), jax.ShapeDtypeStruct((n, d), x2.dtype)],
        # x, residual in and normed, new_residual out, each [rows, D]; the [1, D] weight
        compiler_params=_compiler_params(4 * block_bytes((rows, d), isz) + block_bytes((1, d), weight.dtype.itemsize)),
        cost_estimate=pl.CostEstimate(
            flops=6 * n * d, transcendentals=n,
            # the minimum: read x and residual, write normed and new_residual, read weight once
            bytes_accessed=4 * n * d * isz + d * weight.dtype.itemsize),
        interpret=interpret,
        name="rmsnorm_residual_fwd",
    )(x2, r2, weight.reshape(1, d))


# --------------------------------------------------------------------------------------------- backward


def rmsnorm_bwd_kernel(h_ref, w_ref, g_ref, gh_ref, dh_ref, dw_ref, acc_ref, *, eps, sub, n_rows):
    w = w_ref[...].astype(jnp.float32)
    block_rows = h_ref.shape[0]
    ragged = n_rows % block_rows != 0
    first_row = pl.program_id(0) * block_rows  # read outside the loop body (the interpreter needs it there)
    acc_rows = acc_ref.shape[0]
    acc_ref[...] = jnp.zeros_like(acc_ref)

    def body(j, carry):
        r0 = pl.multiple_of(j * sub, sub)
        rs = pl.ds(r0, sub)
        hf = h_ref[rs, :].astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + eps)  # recomputed: cheaper than HBM
        g = g_ref[rs, :].astype(jnp.float32)
        gw = g * w
        # y = h * inv * w with inv = (mean(h^2) + eps)^-1/2 gives
        #   dh = inv * g*w - h * inv^3 * mean(g*w*h); the residual output adds its cotangent unchanged.
        c = jnp.mean(gw * hf, axis=-1, keepdims=True) * (inv * inv * inv)
        dh_ref[rs, :] = (inv * gw - hf * c + gh_ref[rs, :].astype(jnp.float32)).astype(dh_ref.dtype)
        contrib = g * hf * inv
        if ragged:
            # The last block's rows past N hold stale VMEM (possibly NaN): select them away, a multiply would not.
            row = first_row + r0 + jax.lax.broadcasted_iota(jnp.int32, contrib.shape, 0)
            contrib = jnp.where(row < n_rows, contrib, 0.0)
        # dweight: fold the sub-block onto an 8-row f32 accumulator in VMEM with whole-vreg adds (VALU); the one
        # cross-sublane reduction runs after the loop. (A loop-carried [16, D] value would sit in the 64-vreg
        # register file and spill.)
        part = contrib[0:acc_rows]
        for r in range(acc_rows, sub, acc_rows):
            part = part + contrib[r:r + acc_rows]
        acc_ref[...] += part
        return carry

    jax.lax.fori_loop(0, block_rows // sub, body, 0)
    # One f32 partial sum of dweight per block; the wrapper adds the few partials.
    dw_ref[...] = jnp.sum(acc_ref[...], axis=0, keepdims=True)


def _bwd_call(h2, weight, g2, gh2, eps, bs: BlockSizes, interpret):
    n, d = h2.shape
    isz = h2.dtype.itemsize
    rows, sub = _fit_rows(bs.block_rows_bwd, n, d, isz)
    nb = pl.cdiv(n, rows)
    acc_rows = _SUBLANES if sub % _SUBLANES == 0 else sub
    row_spec = pl.BlockSpec((rows, d), lambda i: (i, 0))
    dh, dw_parts = pl.pallas_call(
        functools.partial(rmsnorm_bwd_kernel, eps=eps, sub=sub, n_rows=n),
        grid=(nb,),
        in_specs=[row_spec, pl.BlockSpec((1, d), lambda i: (0, 0)), row_spec, row_spec],
        out_specs=[row_spec, pl.BlockSpec((None, 1, d), lambda i: (i, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((n, d), h2.dtype), jax.ShapeDtypeStruct((nb, 1, d), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((acc_rows, d), jnp.float32)],
        # h, g, gh in and dh out, each [rows, D]; the [1, D] weight in and dweight partial out
        compiler_params=_compiler_params(4 * block_bytes((rows, d), isz) + block_bytes((1, d), weight.dtype.itemsize)
                                         + block_bytes((1, d), 4), scratch=block_bytes((acc_rows, d), 4)),
        cost_estimate=pl.CostEstimate(
            flops=12 * n * d, transcendentals=n,
            # read h, d(normed), d(new_residual); write d(x) once (it is also d(residual)); weight; partials
            bytes_accessed=4 * n * d * isz + d * weight.dtype.itemsize + nb * d * 4),
        interpret=interpret,
        name="rmsnorm_residual_bwd",
    )(h2, weight.reshape(1, d), g2, gh2)
    return dh, jnp.sum(dw_parts, axis=(0, 1)).astype(weight.dtype)


# ------------------------------------------------------------------------------------- public wrapper


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _rmsnorm(x2, r2, weight, eps, bs, interpret):
    return tuple(_fwd_call(x2, r2, weight, eps, bs, interpret))


def _rmsnorm_fwd(x2, r2, weight, eps, bs, interpret):
    normed, h = _fwd_call(x2, r2, weight, eps, bs, interpret)
    return (normed, h), (h, weight)  # new_residual is an output anyway: saving it costs no memory


def _rmsnorm_bwd(eps, bs, interpret, saved, cts):
    h, weight = saved
    g, gh = cts
    dh, dw = _bwd_call(h, weight, g, gh, eps, bs, interpret)
    return dh, dh, dw  # h = x + residual: both get the same cotangent


_rmsnorm.defvjp(_rmsnorm_fwd, _rmsnorm_bwd)


@functools.partial(jax.jit, static_argnames=("eps", "block_sizes", "interpret"))
def rmsnorm_residual(x, residual, weight, *, eps: float = 1e-6, block_sizes: BlockSizes | None = None,
                     interpret=False):
    """(normed, new_residual) = RMSNorm(x + residual) * weight, x + residual. x, residual [..., D]; weight [D]."""
    _check(x, residual, weight, eps)
    bs = block_sizes if block_sizes is not None else BlockSizes()
    if not isinstance(bs, BlockSizes):
        raise ValueError(f"block_sizes must be rmsnorm.BlockSizes, got {type(bs).__name__}")
    d = x.shape[-1]
    n = math.prod(x.shape[:-1])
    normed, h = _rmsnorm(x.reshape(n, d), residual.reshape(n, d), weight, float(eps), bs, interpret)
    return normed.reshape(x.shape), h.reshape(x.shape)


# jitted: one XLA compile per shape instead of one per op (the verifier calls it eagerly, also under grad
# and in float64), which is most of a verify case's time on CPU.
@functools.partial(jax.jit, static_argnames=("eps",))
def reference(x, residual, weight, *, eps: float = 1e-6):
    """Plain JAX, as a user writes it: the add in the storage dtype, f32 (or wider) statistics."""
    h = x + residual
    hf = h.astype(jnp.promote_types(h.dtype, jnp.float32))
    inv = jax.lax.rsqrt(jnp.mean(hf * hf, axis=-1, keepdims=True) + eps)
    return (hf * inv * weight.astype(hf.dtype)).astype(x.dtype), h


# ------------------------------------------------------------------------------------------------ spec


def _case_args(n, d, dtype, scale=1.0, res_scale=1.0):
    def make(key):
        kx, kr, kw = jax.random.split(key, 3)
        x = (scale * jax.random.normal(kx, (n, d), jnp.float32)).astype(dtype)
        r = (res_scale * jax.random.normal(kr, (n, d), jnp.float32)).astype(dtype)
        w = (1.0 + 0.5 * jax.random.normal(kw, (d,), jnp.float32)).astype(dtype)
        return x, r, w
    return make


def cases() -> list[Case]:
    small = BlockSizes(block_rows=16, block_rows_bwd=16)  # several grid steps at test sizes
    # Five cases: interpret mode compiles the kernel, its backward and three references per case.
    return [
        Case("f32 N=50 (not a block multiple), 4 blocks", _case_args(50, 256, jnp.float32),
             {"block_sizes": small}, "float32", grad=True, grad_argnums=(0, 1, 2)),
        Case("f32 large magnitude (x ~1e4, residual ~1e3)", _case_args(40, 256, jnp.float32, 1e4, 1e3),
             {"block_sizes": small}, "float32", grad=True, grad_argnums=(0, 1, 2)),
        Case("f32 tiny magnitude (eps=1e-2 dominates), D=96 (not a lane multiple), default blocks",
             _case_args(20, 96, jnp.float32, 1e-2, 1e-2), {"eps": 1e-2}, "float32", grad=True, grad_argnums=(0, 1, 2)),
        Case("bf16 N=72 (not a block multiple)", _case_args(72, 256, jnp.bfloat16),
             {"block_sizes": BlockSizes(32, 32)}, "bfloat16", grad=True, grad_argnums=(0, 1, 2)),
        Case("bf16 large magnitude (x ~1e3, residual ~1e2)", _case_args(48, 256, jnp.bfloat16, 1e3, 1e2),
             {"block_sizes": small}, "bfloat16", grad=True, grad_argnums=(0, 1, 2)),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=2e-5, rtol=2e-5, reason=(
        "f32 end to end; the row mean of D squares and the dweight sum over rows are summed in a different order "
        "than XLA's (about sqrt(D) * 6e-8 relative), and the backward subtracts two terms of similar size")),
    "bfloat16": Tolerance(atol=3e-2, rtol=2e-2, reason=(
        "bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per rounding); new_residual is rounded once, normed is "
        "computed from the rounded sum and rounded again, and the reference's gradient rounds d(normed) to bf16 "
        "before adding d(new_residual) where the kernel adds in f32 and rounds once: up to ~2 ulp apart")),
    "bfloat16.grad": Tolerance(atol=1e-1, rtol=2e-2, reason=(
        "dweight sums N rows of d(normed) * h * inv whose bf16 inputs are each rounded (2^-9 relative): against "
        "the float64 oracle the error is a random walk of ~sqrt(N) * 4e-3 * |term|, ~0.03 at N=72 (measured "
        "worst 0.057 over 6 seeds where the sum cancels to ~0.4), so the absolute term grows with the rows summed")),
}

PRODUCTION = (8192, 4096)  # tokens x hidden, bf16: a 7-8B model's per-device activation block
DEFAULT_BLOCKS = BlockSizes()


def _xla(x, residual, weight):
    return reference(x, residual, weight)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    bs = blocks if blocks is not None else DEFAULT_BLOCKS
    n, d = PRODUCTION
    args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((n, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((d,), jnp.bfloat16))

    def kernel(x, residual, weight):
        return rmsnorm_residual(x, residual, weight, block_sizes=bs)

    return BenchSetup(shape=f"N{n} D{d} bf16", args=args, kernel=kernel, xla=_xla, blocks=bs.describe())


SPEC = KernelSpec(
    name="rmsnorm",
    title="RMSNorm with the residual add fused: one read of x and residual, f32 statistics",
    replaces=("x + residual then RMSNorm in plain JAX: XLA computes the sum and the row statistics in one fusion, "
              "writes the sum, reads it back to normalise and copies it out as the returned residual: 470 MB of "
              "bytes accessed at [8192, 4096] bf16 against the 268 MB minimum (read x, residual; write normed, "
              "sum). At that shape XLA's memory-space assignment keeps the 64 MiB sum in VMEM (S(1)), so part of "
              "those bytes is VMEM traffic and the real HBM saving can be smaller than the byte count says"),
    signature=("rmsnorm_residual(x, residual, weight, *, eps=1e-6, block_sizes=None, interpret=False) "
               "-> (normed, new_residual)"),
    tuned_for=("N8192 D4096 bf16: block_rows=256 from bench/sweep_rmsnorm.py on v5e (64-512 all sit at the HBM "
               "floor; 256 has the lowest static estimate of the sizes whose fwd+bwd step compiles)"),
    usage=("from tpudiag.kernels.rmsnorm import rmsnorm_residual\n"
           "normed, resid = rmsnorm_residual(x, resid, ln_weight, eps=1e-6)  # x, resid [tokens, hidden]"),
    kernel=rmsnorm_residual,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(64, 64), BlockSizes(128, 128), BlockSizes(256, 256), BlockSizes(512, 512)),
    differentiable=True,
)
