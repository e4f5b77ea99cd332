"""Rotary position embedding (RoPE) applied to Q and K in one Pallas pass, rotate-half convention.

Reads q [B, S, H, D], k [B, S, KVH, D] and either integer positions ([B, S] or [S]) or cos/sin tables
([S, D] or [B, S, D]); returns (q_rot, k_rot) in q's and k's dtypes, computed in float32.

Convention (rotate-half, as in GPT-NeoX, LLaMA and Hugging Face `apply_rotary_pos_emb`): with
inv_freq[i] = theta^(-2i/D) for i < D/2, angle[d] = position * inv_freq[d mod D/2],
    out = x * cos(angle) + rotate_half(x) * sin(angle),   rotate_half(x) = concat(-x[D/2:], x[:D/2]).
So element d pairs with element d + D/2, not with its neighbour (the interleaved GPT-J convention is not
handled: permute the weights or use another kernel).

Differentiable: RoPE is linear in q and k, and its transpose is the rotation by -angle, so the backward runs this
same kernel with sin negated. With tables, the backward uses the table adjoint (sin applied before the rotation,
which equals the negated-sin rotation for rotate-half tables and stays exact for any table) and the tables'
own gradients come from plain JAX. Positions get no gradient (they are integers).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, fits_vmem, vmem_limit

_SUBLANES = 8  # f32 vreg: 8 sublanes x 128 lanes; the position axis of the cos/sin tiles sits on sublanes


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Sequence positions per grid step; each step rotates every head of q and k at those positions.

    All heads of a position in one step: the position's cos/sin (computed once on the EUP/VALU) are shared by
    all H + KVH heads, so their cost is paid once per position instead of once per head.
    """

    block_s: int = 1024

    def __post_init__(self):
        v = self.block_s
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"block_s must be a positive int, got {v!r}")
        if v % _SUBLANES:
            raise ValueError(f"block_s={v} must be a multiple of {_SUBLANES}: the cos/sin tiles put positions "
                             f"on the 8 sublanes of a vreg")

    def describe(self) -> str:
        return f"block_s={self.block_s}"


def inv_freq(d: int, theta: float, dtype=jnp.float32):
    """theta^(-2i/D) for i < D/2, as the reference and the kernel both use it: computed on the host
    in float64 and rounded once to `dtype`. XLA's f32 pow on a v5e is up to 4e-6 relative off
    (measured against float64), which at position 4096 moves the angle by 0.016 rad."""
    return jnp.asarray(1.0 / (float(theta) ** (np.arange(0, d, 2, dtype=np.float64) / d)), dtype)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def _check(q, k, pos_or_cos, sin, theta):
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be [B, S, heads, D]; got q {q.shape}, k {k.shape}")
    b, s, _, d = q.shape
    if k.shape[0] != b or k.shape[1] != s or k.shape[3] != d:
        raise ValueError(f"k {k.shape} must share B, S and D with q {q.shape}")
    if q.shape[2] == 0 or k.shape[2] == 0 or s == 0 or b == 0:
        raise ValueError(f"empty q or k: q {q.shape}, k {k.shape}")
    if d % 2:
        raise ValueError(f"head dim D={d} must be even (rotate-half pairs d with d + D/2)")
    # D that is not a multiple of 128 (e.g. 64) works, but a head then fills part of a 128-lane vreg row and
    # XLA relayouts q and k around the call (measured: one copy per operand and result at D=64 on v5e).
    for name, a in (("q", q), ("k", k)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise ValueError(f"{name} must be floating point, got {a.dtype}")
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
    if sin is None:
        if not jnp.issubdtype(pos_or_cos.dtype, jnp.integer):
            raise ValueError(f"positions must be integers (or pass cos and sin tables), got {pos_or_cos.dtype}")
        if pos_or_cos.shape not in ((b, s), (s,)):
            raise ValueError(f"positions must be [B, S]=[{b}, {s}] or [S], got {pos_or_cos.shape}")
        if not (isinstance(theta, (int, float)) and theta > 1):
            raise ValueError(f"theta must be a number > 1, got {theta!r}")
    else:
        cos = pos_or_cos
        if cos.shape != sin.shape:
            raise ValueError(f"cos {cos.shape} and sin {sin.shape} tables must have the same shape")
        if cos.shape not in ((s, d), (b, s, d)):
            raise ValueError(f"cos/sin tables must be [S, D]=[{s}, {d}] or [B, S, D], got {cos.shape}")
        for name, a in (("cos", cos), ("sin", sin)):
            if not jnp.issubdtype(a.dtype, jnp.floating):
                raise ValueError(f"{name} table must be floating point, got {a.dtype}")


# ----------------------------------------------------------------------------------------------- kernel


def rope_kernel(*refs, from_tables: bool, adjoint: bool):
    if from_tables:
        cos_ref, sin_ref, lane_ref, q_ref, k_ref, qo_ref, ko_ref = refs
        cos = cos_ref[...].astype(jnp.float32)  # (bs, D)
        sin = sin_ref[...].astype(jnp.float32)
    else:
        pos_ref, lane_ref, q_ref, k_ref, qo_ref, ko_ref = refs
        # Angles for the block's positions only, [bs, D] with positions on sublanes: cos/sin are evaluated
        # once per position and shared by every head below (they are VALU polynomials, ~20x a multiply).
        ang = pos_ref[...].astype(jnp.float32) * lane_ref[0:1, :]  # (bs, 1) * (1, D)
        cos, sin = jnp.cos(ang), jnp.sin(ang)
    sign = lane_ref[1:2, :]  # -1 on the first half of each head, +1 on the second (flipped for -angle)
    d = cos.shape[-1]
    if not adjoint:
        sin = sin * sign  # rotate_half(x) * sin == roll(x, D/2) * (sign * sin): fold the sign in once
    # [bs, 1, D]: one row per position, broadcast over the heads that sit on sublanes of the q/k tiles
    c3, s3 = cos[:, None, :], sin[:, None, :]
    for x_ref, o_ref in ((q_ref, qo_ref), (k_ref, ko_ref)):
        x = x_ref[...].astype(jnp.float32)  # (bs, heads, D); f32 math: v5e's VPU has no bf16 ALU
        # rotate_half on the XLU: rotating a head's D lanes by D/2 swaps its halves (self-inverse, so the
        # rotation direction does not matter); the sign lives in `sign`.
        if adjoint:  # transpose of x*cos + R(x)*sin, with R = roll*sign: g*cos - R(g*sin)
            out = x * c3 - pltpu.roll(x * s3, d // 2, 2) * sign[:, None, :]
        else:
            out = x * c3 + pltpu.roll(x, d // 2, 2) * s3
        o_ref[...] = out.astype(o_ref.dtype)


def _block_s(block: int, s: int, step_bytes) -> int:
    """Positions per step: the whole sequence when it is shorter than a block (a full-dimension block is
    always legal), else `block`, halved while its buffers do not fit the VMEM rule (tiling.fits_vmem).
    `step_bytes(positions)`: one buffer of every pipelined block at that many positions."""
    if s <= block:
        return s
    while block > _SUBLANES and not fits_vmem(step_bytes(block)):
        block = max(_SUBLANES, block // 2 // _SUBLANES * _SUBLANES)
    return block


def _call(q, k, tables_or_pos, lane, *, from_tables, adjoint, bs: BlockSizes, interpret):
    b, s, h, d = q.shape
    kvh = k.shape[2]
    isz = q.dtype.itemsize
    if from_tables:
        cos, sin = tables_or_pos
        lead_isz, lead_cols, n_lead = cos.dtype.itemsize, d, 2  # a [bs, D] cos and sin block
    else:
        lead_isz, lead_cols, n_lead = 4, 1, 1  # int32 positions, a [bs, 1] column

    def step_bytes(blk):
        # One buffer of every pipelined block: q and k in and out, the positions or tables, the [2, D] lane
        # constants. No scratch: the f32 temporaries (x, rolled, out; v5e's VPU has no bf16 ALU) are not VMEM
        # buffers. Measured (libtpu 0.0.42 and 0.0.50.1, v5e, B1 S8192 H32 KVH8 D128 bf16, block_s=512): Mosaic
        # allocates 20 MiB of windows and 4.07 MiB of register spill slots, which the rule's second copy covers.
        return (2 * block_bytes((blk, h, d), isz) + 2 * block_bytes((blk, kvh, d), isz)
                + n_lead * block_bytes((blk, lead_cols), lead_isz) + block_bytes((2, d), 4))

    blk = _block_s(bs.block_s, s, step_bytes)
    grid = (b, pl.cdiv(s, blk))
    # The last block may run past S: its extra positions read stale VMEM and their writes are dropped;
    # positions are independent, so nothing needs masking and no padded copy is made in HBM.
    qspec = pl.BlockSpec((None, blk, h, d), lambda i, j: (i, j, 0, 0))
    kspec = pl.BlockSpec((None, blk, kvh, d), lambda i, j: (i, j, 0, 0))
    lane_spec = pl.BlockSpec((2, d), lambda i, j: (0, 0))  # same block every step: fetched once
    if from_tables:
        if cos.ndim == 2:
            tspec = pl.BlockSpec((blk, d), lambda i, j: (j, 0))
        else:
            tspec = pl.BlockSpec((None, blk, d), lambda i, j: (i, j, 0))
        in_specs, lead = [tspec, tspec], (cos, sin)
        extra_bytes = 2 * b * s * d * cos.dtype.itemsize  # an [S, D] table is fetched again per batch row
        transcendentals = 0
    else:
        pos3 = tables_or_pos.reshape(b, s, 1)  # positions on sublanes, next to the [bs, D] angle tile
        in_specs, lead = [pl.BlockSpec((None, blk, 1), lambda i, j: (i, j, 0))], (pos3,)
        extra_bytes = b * s * 4
        transcendentals = 2 * b * s * d
    vmem = vmem_limit(step_bytes(blk))
    return pl.pallas_call(
        functools.partial(rope_kernel, from_tables=from_tables, adjoint=adjoint),
        grid=grid,
        in_specs=[*in_specs, lane_spec, qspec, kspec],
        out_specs=[qspec, kspec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel"),
            vmem_limit_bytes=vmem),
        cost_estimate=pl.CostEstimate(
            flops=3 * (q.size + k.size), transcendentals=transcendentals,
            # the minimum: read q and k once, write them once, plus the positions (or tables)
            bytes_accessed=2 * (q.size + k.size) * isz + extra_bytes + 2 * d * 4),
        interpret=interpret,
        name="rope_qk_adjoint" if adjoint else "rope_qk",
    )(*lead, lane, q, k)


def _lane_constants(d, theta, inverse):
    """[2, D] f32: row 0 the angle per unit position for each lane, row 1 rotate_half's sign per lane."""
    half = d // 2
    freq = jnp.tile(inv_freq(d, theta, jnp.float32), 2) if theta is not None else jnp.zeros((d,), jnp.float32)
    sign = jnp.where(jnp.arange(d) < half, -1.0, 1.0).astype(jnp.float32)
    return jnp.stack([freq, -sign if inverse else sign])


# ------------------------------------------------------------------------------------------- custom_vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _rope_pos(q, k, positions, theta, bs, interpret):
    return tuple(_call(q, k, positions, _lane_constants(q.shape[-1], theta, False),
                       from_tables=False, adjoint=False, bs=bs, interpret=interpret))


def _rope_pos_fwd(q, k, positions, theta, bs, interpret):
    return _rope_pos(q, k, positions, theta, bs, interpret), positions


def _rope_pos_bwd(theta, bs, interpret, positions, cts):
    gq, gk = cts
    # The transpose of a rotation by +angle is the rotation by -angle: the same kernel with sin negated.
    dq, dk = _call(gq, gk, positions, _lane_constants(gq.shape[-1], theta, True),
                   from_tables=False, adjoint=False, bs=bs, interpret=interpret)
    return dq, dk, None  # integer positions: no cotangent


_rope_pos.defvjp(_rope_pos_fwd, _rope_pos_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _rope_tab(q, k, cos, sin, bs, interpret):
    return tuple(_call(q, k, (cos, sin), _lane_constants(q.shape[-1], None, False),
                       from_tables=True, adjoint=False, bs=bs, interpret=interpret))


def _rope_tab_fwd(q, k, cos, sin, bs, interpret):
    return _rope_tab(q, k, cos, sin, bs, interpret), (q, k, cos, sin)


def _rope_tab_bwd(bs, interpret, saved, cts):
    q, k, cos, sin = saved
    gq, gk = cts
    dq, dk = _call(gq, gk, (cos, sin), _lane_constants(q.shape[-1], None, False),
                   from_tables=True, adjoint=True, bs=bs, interpret=interpret)

    # The tables' gradients, in plain JAX (XLA drops them when only dq/dk are used): sum over heads.
    def table_grads(g, x):
        gf, xf = g.astype(jnp.float32), x.astype(jnp.float32)
        return jnp.sum(gf * xf, axis=2), jnp.sum(gf * rotate_half(xf), axis=2)

    cq, sq = table_grads(gq, q)
    ck, sk = table_grads(gk, k)
    dcos, dsin = cq + ck, sq + sk
    if cos.ndim == 2:
        dcos, dsin = jnp.sum(dcos, axis=0), jnp.sum(dsin, axis=0)
    return dq, dk, dcos.astype(cos.dtype), dsin.astype(sin.dtype)


_rope_tab.defvjp(_rope_tab_fwd, _rope_tab_bwd)


# ----------------------------------------------------------------------------------------------- public


@functools.partial(jax.jit, static_argnames=("theta", "block_sizes", "interpret"))
def rope(q, k, positions_or_cos, sin=None, *, theta: float = 10000.0, block_sizes: BlockSizes | None = None,
         interpret=False):
    """(q_rot, k_rot): rotate-half RoPE of q [B, S, H, D] and k [B, S, KVH, D] in one pass.

    `positions_or_cos`: int positions [B, S] or [S] (angles from `theta`), or, with `sin` given, the cos table
    [S, D] or [B, S, D] in rotate-half layout (cos[..., d] for lane d, i.e. concat(cos(f), cos(f)))."""
    _check(q, k, positions_or_cos, sin, theta)
    bs = block_sizes if block_sizes is not None else BlockSizes()
    if not isinstance(bs, BlockSizes):
        raise ValueError(f"block_sizes must be rope.BlockSizes, got {type(bs).__name__}")
    if sin is None:
        positions = positions_or_cos.astype(jnp.int32)
        if positions.ndim == 1:
            positions = jnp.broadcast_to(positions, q.shape[:2])
        return _rope_pos(q, k, positions, float(theta), bs, interpret)
    return _rope_tab(q, k, positions_or_cos, sin, bs, interpret)


def rope_tables(positions, d: int, theta: float = 10000.0, dtype=jnp.float32):
    """cos, sin [..., D] for integer positions [...], rotate-half layout."""
    ang = positions.astype(dtype)[..., None] * inv_freq(d, theta, dtype)
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


# jitted: one XLA compile per shape instead of one per op (the verifier calls it eagerly, also under grad
# and in float64), which is most of a verify case's time on CPU.
@functools.partial(jax.jit, static_argnames=("theta",))
def reference(q, k, positions_or_cos, sin=None, *, theta: float = 10000.0):
    """Plain JAX rotate-half RoPE, as users write it: f32 (or wider) math, cast back to the input dtype."""
    ct = jnp.promote_types(q.dtype, jnp.float32)
    if sin is None:
        cos, sin = rope_tables(positions_or_cos, q.shape[-1], theta, ct)
    else:
        cos, sin = positions_or_cos.astype(ct), sin.astype(ct)
    cos, sin = cos[..., None, :], sin[..., None, :]  # broadcast over heads ([S, 1, D] also over B)

    def apply(x):
        xf = x.astype(ct)
        return (xf * cos + rotate_half(xf) * sin).astype(x.dtype)

    return apply(q), apply(k)


# ------------------------------------------------------------------------------------------------- spec


def _pos_args(b, s, h, kvh, d, dtype, max_pos=4096, scale=1.0, shared=False):
    def make(key):
        kq, kk, kp = jax.random.split(key, 3)
        q = (scale * jax.random.normal(kq, (b, s, h, d), jnp.float32)).astype(dtype)
        k = (scale * jax.random.normal(kk, (b, s, kvh, d), jnp.float32)).astype(dtype)
        pos = jax.random.randint(kp, (s,) if shared else (b, s), 0, max_pos, jnp.int32)
        return q, k, pos
    return make


def _table_args(b, s, h, kvh, d, dtype, batched):
    def make(key):
        kq, kk, kc, ks = jax.random.split(key, 4)
        q = jax.random.normal(kq, (b, s, h, d), jnp.float32).astype(dtype)
        k = jax.random.normal(kk, (b, s, kvh, d), jnp.float32).astype(dtype)
        shape = (b, s, d) if batched else (s, d)
        # arbitrary tables (not unit-norm pairs): checks the kernel applies exactly what it is given
        cos = jax.random.uniform(kc, shape, jnp.float32, -1.0, 1.0).astype(dtype)
        sin = jax.random.uniform(ks, shape, jnp.float32, -1.0, 1.0).astype(dtype)
        return q, k, cos, sin
    return make


def cases() -> list[Case]:
    small = BlockSizes(block_s=16)
    return [
        Case("f32 B2 S40 (not a block multiple) H4 KVH2 D128, positions", _pos_args(2, 40, 4, 2, 128, jnp.float32),
             {"block_sizes": small}, "float32", grad=True, grad_argnums=(0, 1)),
        # Large values only at small positions: a rotation's f32 error is |x| * (angle error), and the angle
        # position * inv_freq carries half an ulp of the position's magnitude (see the tolerance).
        Case("f32 large magnitude (x ~1e3) at positions < 8, shared [S] positions, D256, theta 5e5",
             _pos_args(1, 24, 2, 1, 256, jnp.float32, max_pos=8, scale=1e3, shared=True),
             {"block_sizes": BlockSizes(8), "theta": 500000.0}, "float32"),  # linear op: grads add nothing here
        Case("f32 tables [S, D] (arbitrary values), D64, grads of q, k, cos, sin",
             _table_args(2, 24, 2, 2, 64, jnp.float32, False),
             {"block_sizes": small}, "float32", grad=True, grad_argnums=(0, 1, 2, 3)),
        Case("bf16 B1 S72 H8 KVH2 D128, positions, default blocks", _pos_args(1, 72, 8, 2, 128, jnp.bfloat16),
             {}, "bfloat16", grad=True, grad_argnums=(0, 1)),
        # forward only: the tables' backward (the adjoint kernel) is checked in f32 above, bf16 kernels in the
        # positions case; interpret-mode compiles are what a case costs on CPU
        Case("bf16 tables [B, S, D], S not a block multiple", _table_args(2, 20, 4, 1, 128, jnp.bfloat16, True),
             {"block_sizes": small}, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(atol=2e-3, rtol=2e-3, reason=(
        "the angle position * inv_freq is an f32 product: at position 4096 half an ulp is 2.4e-4 rad, so any "
        "f32 RoPE (this kernel, the plain-JAX reference) is up to ~2.4e-4 * |x| (~1e-3 for |x| ~ 4) from the "
        "float64 oracle, and a one-ulp difference in inv_freq between two XLA computations moves it as much; "
        "the absolute term is needed where x*cos and rotate_half(x)*sin cancel")),
    "bfloat16": Tolerance(atol=2e-2, rtol=1.6e-2, reason=(
        "outputs are rounded to bf16 (8 significant bits, 3.9e-3 relative per rounding) after f32 math; "
        "the f32 angle error at position 4096 adds ~5e-4 relative; q*cos + rotate_half(q)*sin can cancel, so "
        "the absolute term covers values near zero")),
}

PRODUCTION = (1, 8192, 32, 8, 128)  # B, S, H, KVH, D: a LLaMA-style 8B layer (GQA 32/8) at 8k tokens
DEFAULT_BLOCKS = BlockSizes()  # block_s=1024: see tuned_for


def _xla(q, k, positions):
    return reference(q, k, positions)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    bs = blocks if blocks is not None else DEFAULT_BLOCKS
    b, s, h, kvh, d = PRODUCTION
    args = (jax.ShapeDtypeStruct((b, s, h, d), jnp.bfloat16), jax.ShapeDtypeStruct((b, s, kvh, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((b, s), jnp.int32))

    def kernel(q, k, positions):
        return rope(q, k, positions, block_sizes=bs)

    return BenchSetup(shape=f"B{b} S{s} H{h} KVH{kvh} D{d} bf16, int32 positions", args=args, kernel=kernel,
                      xla=_xla, blocks=bs.describe())


SPEC = KernelSpec(
    name="rope",
    title="Rotary embedding (rotate-half) of Q and K in one pass, angles computed in the kernel",
    replaces=("plain-JAX rotate-half RoPE: XLA materialises f32 copies of q and k, splits and negates halves and "
              "rebuilds them with a pad+max concatenate: 1.12 GB of bytes accessed at B1 S8192 H32 KVH8 D128 bf16 "
              "on v5e (TPU-NOTES measured 822 MB for another spelling) against the 168 MB minimum (read q and k "
              "once, write them once)"),
    signature=("rope(q, k, positions_or_cos, sin=None, *, theta=10000.0, block_sizes=None, interpret=False) "
               "-> (q_rot, k_rot)"),
    tuned_for=("B1 S8192 H32 KVH8 D128 bf16, int32 positions: block_s=1024 on a v5e chip (bench/chip_sweep.py, "
               "device time, min of 5: 256 257.5 us, 512 256.6, 1024 254.5); the static profile puts 64-1024 "
               "all at the HBM floor. The fwd+bwd step compiles at 1024 for v5e"),
    usage=("from tpudiag.kernels.rope import rope\n"
           "q, k = rope(q, k, positions, theta=10000.0)  # q [B,S,H,D], k [B,S,KVH,D], positions int32 [B,S]\n"
           "q, k = rope(q, k, cos, sin)                  # or precomputed rotate-half tables [S,D]"),
    kernel=rope,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(BlockSizes(64), BlockSizes(128), BlockSizes(256), BlockSizes(512), BlockSizes(1024)),
    differentiable=True,
)
