"""Grouped matmul for Mixture-of-Experts: rows sorted by expert, each group times its own expert.

`grouped_matmul(lhs [M, K], rhs [E, K, N], group_sizes int32 [E])` returns out [M, N] with
out[r] = lhs[r] @ rhs[e] for the rows r of group e (groups are consecutive row ranges in the order
of `group_sizes`) and zeros for the rows past sum(group_sizes). Inputs bf16 or f32 (both alike), f32
accumulation, output in the input dtype; differentiable in lhs and rhs (custom_vjp with Pallas
backward kernels in `grouped_matmul_bwd.py`).

How: a schedule of (row tile, group) visits is built from `group_sizes` in jnp before the kernel and
scalar-prefetched into SMEM; the grid walks it and index_maps fetch each visit's lhs tile and
expert block. A tile that spans a group boundary is visited once per group and each visit stores
only its own rows. This module reads nothing and compiles nothing; `verify.py` and `bench.py` use
its `SPEC`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.grouped_matmul_bwd import tgmm_pallas
from tpudiag.kernels.grouped_matmul_schedule import (COMPUTE, FGROUP, FLAGS, FTILE, HI, LO, TILE, TILE_FIRST,
                                                     computed_rows, keep_in_hbm, make_schedule, num_visits,
                                                     visit_field)
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, round_up, vmem_limit



@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes: `block_m` rows of lhs per visit (one DMA), `block_k` of the contraction,
    `block_n` output columns, and `compute_m`, the row granularity of the matmuls inside a tile:
    a visit multiplies only the `compute_m`-row slices that hold rows of its group, so a tile
    shared by two groups costs about one extra slice, not one extra tile. A block larger than its
    dimension shrinks to the dimension, so the defaults serve any shape; they come from
    `bench/sweep_grouped_matmul.py` at the production shape.

    block_k=4096 and block_n=1792 (all of K and N at the production shape) keep one expert's whole
    [K, N] matrix resident in VMEM while the grid walks that expert's row tiles: each expert is
    read from HBM once and each lhs row once, the minimum traffic.
    """

    block_m: int = 512
    block_k: int = 4096
    block_n: int = 1792
    compute_m: int = 128

    def __post_init__(self):
        for name in ("block_m", "block_k", "block_n", "compute_m"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"BlockSizes.{name} must be a positive int, got {v!r}")
        # 16 rows: a bf16 vreg packs 16 sublanes (8 x 32-bit rows two to a word).
        for name in ("block_m", "compute_m"):
            if getattr(self, name) % 16:
                raise ValueError(f"BlockSizes.{name}={getattr(self, name)} must be a multiple of 16 "
                                 "(a bf16 vreg holds 16 rows)")
        if self.block_m % self.compute_m:
            raise ValueError(f"BlockSizes.compute_m={self.compute_m} must divide block_m={self.block_m}")
        # 128 lanes: the VPU/MXU tile is 8 x 128; a contraction or column block off the lane width
        # would be padded inside every vreg.
        for name in ("block_k", "block_n"):
            if getattr(self, name) % 128:
                raise ValueError(f"BlockSizes.{name}={getattr(self, name)} must be a multiple of 128 "
                                 "(the TPU lane width)")

    def text(self) -> str:
        return (f"block_m={self.block_m}, block_k={self.block_k}, block_n={self.block_n}, "
                f"compute_m={self.compute_m}")


def fit_block(dim: int, block: int, align: int) -> tuple[int, int]:
    """(block, padded dim) for one dimension: the whole dimension when it fits in one block, the
    block when it divides, else the largest `align` multiple >= block/2 that divides, else the dim
    padded up to a multiple of the block (a copy in HBM: the last resort)."""
    if dim <= block:
        return dim, dim
    if dim % block == 0:
        return block, dim
    for b in range(block - align, block // 2 - 1, -align):
        if b > 0 and dim % b == 0:
            return b, dim
    return block, round_up(dim, block)


def hbm_bytes(mp: int, kp: int, np_: int, e: int, bm: int, bk: int, bn: int, isz: int, osz: int) -> int:
    """HBM traffic of the forward schedule in the worst case (every group non-empty, every boundary
    inside a tile). With the whole contraction in one block (bk == Kp), a visit that reuses the
    previous visit's lhs tile or expert slice triggers no DMA: lhs is read once per column block and
    each expert once. Otherwise every visit streams its lhs tile and expert slice again."""
    n_tiles, visits = np_ // bn, mp // bm + e - 1
    if bk == kp:
        # An expert no row is routed to is not read (its visit fetches the last computed block): at
        # most one expert a row.
        lhs, rhs = n_tiles * mp * kp, min(e, mp) * kp * np_
    else:
        lhs, rhs = n_tiles * visits * bm * kp, visits * kp * np_
    return (lhs + rhs) * isz + mp * np_ * osz


# --------------------------------------------------------------------------------------- forward
def gmm_kernel(sched_ref, lhs_ref, *refs, v_max: int, k_tiles: int, block_m: int, compute_m: int,
               transpose_rhs: bool, precision, gated: bool = False):
    """One (column block, visit, contraction block) step: the out rows of this visit's group =
    lhs rows @ expert block; the tile's other rows are kept (zeroed on the tile's first visit).
    The tile is processed in `compute_m`-row slices; slices with no row of the group are skipped.
    `gated`: two expert blocks (gate, up) and out = silu(lhs @ gate) * (lhs @ up), the SwiGLU of
    an MoE expert, taken from the f32 accumulators before the single rounding to the output dtype."""
    n_rhs = 2 if gated else 1
    rhs_refs, out_ref, accs = refs[:n_rhs], refs[n_rhs], refs[n_rhs + 1:]
    v = pl.program_id(1)
    kk = pl.program_id(2)
    flags = visit_field(sched_ref, FLAGS, v, v_max)
    compute = (flags & COMPUTE) != 0
    tile_first = (flags & TILE_FIRST) != 0
    tile_row = visit_field(sched_ref, TILE, v, v_max) * block_m
    lo = visit_field(sched_ref, LO, v, v_max)
    hi = visit_field(sched_ref, HI, v, v_max)
    # lhs [cm, bk] x rhs [bk, bn] (or rhs [bn, bk] for the dlhs pass: g @ rhs^T, contracting the
    # minor dims of both, which the MXU takes without a transpose).
    dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))

    def finish(values):
        if not gated:
            return values[0]
        g, u = values
        return g * (1.0 / (1.0 + jnp.exp(-g))) * u

    for i in range(block_m // compute_m):  # static: a few slices per tile
        rows = pl.ds(i * compute_m, compute_m)
        r0 = tile_row + i * compute_m
        touches = compute & (r0 < hi) & (r0 + compute_m > lo)

        def product(rows=rows):
            # f32 accumulation: bf16 sums over K of thousands drift past 1e-2.
            x = lhs_ref[rows, :]
            return tuple(jax.lax.dot_general(x, r[...], dims, precision=precision,
                                             preferred_element_type=jnp.float32) for r in rhs_refs)

        def store(value, rows=rows, r0=r0):
            # One select per slice, also for slices wholly inside the group: a [cm, bn] select is
            # VPU work beside a [cm, bk] x [bk, bn] matmul on the MXU (<1/bk of its element ops),
            # and a branch for the fast case doubles the kernel's branches.
            r = r0 + jax.lax.broadcasted_iota(jnp.int32, (compute_m, out_ref.shape[1]), 0)
            keep = jnp.where(tile_first, jnp.zeros_like(out_ref[rows, :]), out_ref[rows, :])
            out_ref[rows, :] = jnp.where((r >= lo) & (r < hi), finish(value).astype(out_ref.dtype), keep)

        def zero_if_first(rows=rows, touches=touches):
            # A slice with no row of this group, on the tile's first visit: rows past the groups
            # (or of groups visited later, which overwrite them) start as zeros.
            @pl.when(tile_first & jnp.logical_not(touches))
            def _():
                out_ref[rows, :] = jnp.zeros((compute_m, out_ref.shape[1]), out_ref.dtype)

        if k_tiles == 1:  # the whole contraction in one step: no accumulator round trip
            pl.when(touches)(lambda product=product, store=store: store(product()))
            zero_if_first()
            continue

        @pl.when(touches & (kk == 0))
        def _(rows=rows, product=product):
            for acc, p in zip(accs, product()):
                acc[rows, :] = p

        @pl.when(touches & (kk > 0))
        def _(rows=rows, product=product):
            for acc, p in zip(accs, product()):
                acc[rows, :] += p

        @pl.when(kk == k_tiles - 1)
        def _(rows=rows, touches=touches, store=store, zero_if_first=zero_if_first):
            pl.when(touches)(lambda: store(tuple(acc[rows, :] for acc in accs)))
            zero_if_first()


def gmm_pallas(lhs, rhs, sched, *, bm: int, bk: int, bn: int, cm: int, v_max: int, transpose_rhs: bool,
               out_dtype, interpret: bool, up=None, name: str = "grouped_matmul"):
    """pallas_call over padded operands: lhs [Mp, Kp], rhs [E, Kp, Np] (or [E, Np, Kp] transposed),
    both already padded to block multiples. Returns [Mp, Np]. With `up` (a second [E, Kp, Np]),
    silu(lhs @ rhs) * (lhs @ up) per group (gmm_kernel's `gated`)."""
    mp, kp = lhs.shape
    e = rhs.shape[0]
    np_ = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    k_tiles, n_tiles = kp // bk, np_ // bn

    def lhs_map(n, v, k, s):
        return s[FTILE * v_max + v], k

    if transpose_rhs:
        rhs_spec = pl.BlockSpec((None, bn, bk), lambda n, v, k, s: (s[FGROUP * v_max + v], n, k))
    else:
        rhs_spec = pl.BlockSpec((None, bk, bn), lambda n, v, k, s: (s[FGROUP * v_max + v], k, n))
    out_spec = pl.BlockSpec((bm, bn), lambda n, v, k, s: (s[TILE * v_max + v], n))

    isz = jnp.dtype(lhs.dtype).itemsize
    osz = jnp.dtype(out_dtype).itemsize
    n_rhs = 1 if up is None else 2
    weights = (rhs,) if up is None else (rhs, up)
    # Traffic: one more expert matrix per weight; the lhs is read once for both.
    traffic = hbm_bytes(mp, kp, np_, e, bm, bk, bn, isz, osz) + (n_rhs - 1) * min(e, mp) * kp * np_ * isz
    cost = pl.CostEstimate(flops=2 * n_rhs * computed_rows(mp, bm, cm, e) * kp * np_,
                           transcendentals=0 if up is None else mp * np_, bytes_accessed=traffic + sched.size * 4)
    scratch = [] if k_tiles == 1 else [pltpu.VMEM((bm, bn), jnp.float32)] * n_rhs
    # The default scoped VMEM is too small for a resident [K, block_n] expert slice: tiling.vmem_limit.
    rhs_block = (bn, bk) if transpose_rhs else (bk, bn)
    vmem = vmem_limit(block_bytes((bm, bk), isz) + n_rhs * block_bytes(rhs_block, isz)
                      + block_bytes((bm, bn), osz),
                      scratch=0 if k_tiles == 1 else n_rhs * block_bytes((bm, bn), 4))
    # f32 inputs: HIGHEST asks the MXU for full f32 (multi-pass); the default would round to bf16.
    precision = jax.lax.Precision.HIGHEST if lhs.dtype == jnp.float32 else None
    kernel = functools.partial(gmm_kernel, v_max=v_max, k_tiles=k_tiles, block_m=bm, compute_m=cm,
                               transpose_rhs=transpose_rhs, precision=precision, gated=up is not None)
    sched = keep_in_hbm(sched)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(n_tiles, v_max, k_tiles),
            in_specs=[pl.BlockSpec((bm, bk), lhs_map)] + [rhs_spec] * n_rhs,
            out_specs=out_spec,
            scratch_shapes=scratch),
        # Column blocks are independent (a megacore chip may split them); visits must run in order
        # because consecutive visits of a boundary tile share its output block.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=vmem),
        cost_estimate=cost,
        interpret=interpret,
        name=name,
    )(sched, lhs, *weights)


# --------------------------------------------------------------------------------------- wrapper
_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static layout of one call: effective blocks, padded dims, tile counts, schedule length."""

    m: int
    k: int
    n: int
    e: int
    bm: int
    bk: int
    bn: int
    cm: int
    mp: int
    kp: int
    np_: int
    m_tiles: int
    v_max: int


def make_plan(lhs_shape, rhs_shape, block_sizes: BlockSizes) -> Plan:
    m, k = lhs_shape
    e, _, n = rhs_shape
    # Rows align to 16 (bf16 sublane packing) when a ragged M is padded; K and N to 128 lanes.
    bm, mp = fit_block(m, block_sizes.block_m, 16)
    bk, kp = fit_block(k, block_sizes.block_k, 128)
    bn, np_ = fit_block(n, block_sizes.block_n, 128)
    # The compute slice shrinks to the whole tile when it does not divide it (small or odd M).
    cm = block_sizes.compute_m if bm % block_sizes.compute_m == 0 else bm
    m_tiles = mp // bm
    return Plan(m, k, n, e, bm, bk, bn, cm, mp, kp, np_, m_tiles, num_visits(m_tiles, e))


def check_args(lhs, rhs, group_sizes) -> None:
    """Shape and dtype errors, raised before anything is traced into a kernel."""
    if lhs.ndim != 2:
        raise ValueError(f"lhs must be [M, K], got shape {lhs.shape}")
    if rhs.ndim != 3:
        raise ValueError(f"rhs must be [E, K, N] (one [K, N] matrix per expert), got shape {rhs.shape}")
    if group_sizes.ndim != 1 or group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"group_sizes must be [E] with E = rhs.shape[0] = {rhs.shape[0]}, "
                         f"got shape {group_sizes.shape}")
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"contraction mismatch: lhs is [M, {lhs.shape[1]}] but rhs is [E, {rhs.shape[1]}, N]")
    if min(lhs.shape) == 0 or min(rhs.shape) == 0:
        raise ValueError(f"empty operand: lhs {lhs.shape}, rhs {rhs.shape}")
    if jnp.dtype(lhs.dtype) not in _DTYPES or lhs.dtype != rhs.dtype:
        raise ValueError(f"lhs and rhs must both be bfloat16 or both float32, got {lhs.dtype} and {rhs.dtype}")
    if group_sizes.dtype != jnp.int32:
        raise ValueError(f"group_sizes must be int32, got {group_sizes.dtype}")


def _pad_to(x, shape):
    pads = [(0, t - s) for s, t in zip(x.shape, shape)]
    return x if all(p == 0 for _, p in pads) else jnp.pad(x, pads)


def _forward(lhs, rhs, group_sizes, block_sizes, interpret):
    p = make_plan(lhs.shape, rhs.shape, block_sizes)
    sched = make_schedule(group_sizes, m=p.m, block_m=p.bm, m_tiles=p.m_tiles)
    out = gmm_pallas(_pad_to(lhs, (p.mp, p.kp)), _pad_to(rhs, (p.e, p.kp, p.np_)), sched, bm=p.bm,
                     bk=p.bk, bn=p.bn, cm=p.cm, v_max=p.v_max, transpose_rhs=False, out_dtype=lhs.dtype,
                     interpret=interpret)
    return out[:p.m, :p.n], sched


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(lhs, rhs, group_sizes, block_sizes, interpret):
    return _forward(lhs, rhs, group_sizes, block_sizes, interpret)[0]


def _gmm_fwd(lhs, rhs, group_sizes, block_sizes, interpret):
    out, sched = _forward(lhs, rhs, group_sizes, block_sizes, interpret)
    return out, (lhs, rhs, sched)


def _gmm_bwd(block_sizes, interpret, res, g):
    lhs, rhs, sched = res
    p = make_plan(lhs.shape, rhs.shape, block_sizes)
    g_p = _pad_to(g.astype(lhs.dtype), (p.mp, p.np_))
    # dlhs = g @ rhs[e]^T per group: the forward kernel contracting N (block_n) into K columns.
    dlhs = gmm_pallas(g_p, _pad_to(rhs, (p.e, p.kp, p.np_)), sched, bm=p.bm, bk=p.bn, bn=p.bk, cm=p.cm,
                      v_max=p.v_max, transpose_rhs=True, out_dtype=lhs.dtype, interpret=interpret)
    # drhs[e] = lhs_e^T @ g_e, summed over the row tiles of group e; zeros for empty groups.
    drhs = tgmm_pallas(_pad_to(lhs, (p.mp, p.kp)), g_p, sched, e=p.e, bm=p.bm, bk=p.bk, bn=p.bn, cm=p.cm,
                       v_max=p.v_max, out_dtype=rhs.dtype, interpret=interpret)
    return dlhs[:p.m, :p.k], drhs[:, :p.k, :p.n], None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def grouped_matmul(lhs, rhs, group_sizes, *, block_sizes: BlockSizes | None = None, interpret: bool = False):
    """out[r] = lhs[r] @ rhs[e] for the rows r of group e; rows past sum(group_sizes) are zero.

    lhs [M, K] (rows sorted by group), rhs [E, K, N], group_sizes int32 [E] with sum <= M; lhs and
    rhs both bfloat16 or both float32; out [M, N] in their dtype, accumulated in f32.
    Differentiable in lhs and rhs. `interpret=True` runs the Pallas interpreter (CPU).
    """
    check_args(lhs, rhs, group_sizes)
    return _gmm(lhs, rhs, group_sizes, block_sizes or BlockSizes(), interpret)


@jax.jit
def reference(lhs, rhs, group_sizes):
    """Pure JAX: every expert applied to every row, each row keeping its own group's product (the
    dense masked computation, E times the useful FLOPs). Runs in float64 under jax.enable_x64()."""
    m = lhs.shape[0]
    acc = jnp.float64 if lhs.dtype == jnp.float64 else jnp.float32
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    starts = ends - group_sizes.astype(jnp.int32)
    rows = jnp.arange(m)[:, None]
    member = (rows >= starts[None, :]) & (rows < ends[None, :])  # [M, E]
    out = jnp.zeros((m, rhs.shape[2]), acc)
    for e in range(rhs.shape[0]):
        prod = jnp.dot(lhs, rhs[e], precision=jax.lax.Precision.HIGHEST, preferred_element_type=acc)
        out = out + jnp.where(member[:, e:e + 1], prod, 0)
    return out.astype(lhs.dtype)


# ------------------------------------------------------------------------------------ verify, bench
def _sizes_args(m, k, n, sizes, dtype, e=None):
    """make_args: random lhs and rhs; group sizes fixed (a list) or, for "random", a random
    partition of a random share of the rows over `e` groups with every third group empty."""
    def make(key):
        k1, k2, k3 = jax.random.split(key, 3)
        ne = len(sizes) if sizes != "random" else e
        lhs = jax.random.normal(k1, (m, k), jnp.float32).astype(dtype)
        rhs = jax.random.normal(k2, (ne, k, n), jnp.float32).astype(dtype)
        if sizes == "random":
            cuts = jnp.sort(jax.random.randint(k3, (ne,), 0, m + 1))
            gs = jnp.where(jnp.arange(ne) % 3 == 1, 0, jnp.diff(cuts, prepend=0))
        else:
            gs = jnp.asarray(sizes, jnp.int32)
        return lhs, rhs, gs.astype(jnp.int32)
    return make


def cases() -> list[Case]:
    # Small tiles so a few hundred rows make several tiles, compute slices and column/contraction
    # blocks. Cases that share a shape share their compiled interpret programs (group sizes are
    # runtime values), which keeps the whole list fast on CPU.
    small = {"block_sizes": BlockSizes(block_m=64, block_k=128, block_n=128, compute_m=32)}
    tiny = {"block_sizes": BlockSizes(block_m=32, block_k=128, block_n=128, compute_m=16)}
    f32, bf16 = jnp.float32, jnp.bfloat16
    return [
        # M=200 is not a multiple of 64 (padded); 177 rows in groups, 23 zero rows after; groups
        # start mid-tile and mid-slice; an empty group; K in two blocks (the accumulator path).
        Case("f32 ragged groups, empty group, rows past the sum, K in 2 blocks",
             _sizes_args(200, 256, 256, [37, 0, 90, 50], f32), small, "float32", grad=True, grad_argnums=(0, 1)),
        Case("f32 random partition (tiles spanning several groups)",
             _sizes_args(200, 256, 256, "random", f32, e=4), small, "float32"),
        # Leading and inner empty groups, groups fill M exactly, whole K in one block.
        Case("bf16 leading and inner empty groups, sum == M",
             _sizes_args(160, 128, 256, [0, 33, 47, 0, 80], bf16), tiny, "bfloat16", grad=True, grad_argnums=(0, 1)),
        Case("bf16 every row in one middle group",
             _sizes_args(160, 128, 256, [0, 0, 160, 0, 0], bf16), tiny, "bfloat16"),
        # Every group empty: every row is past the sum, the whole output must be zero.
        Case("bf16 all groups empty (every row masked)",
             _sizes_args(160, 128, 256, [0, 0, 0, 0, 0], bf16), tiny, "bfloat16"),
        # K=200 and N=136 are not multiples of 128: the wrapper pads them.
        Case("f32 K and N off the 128 lanes (padded)",
             _sizes_args(130, 200, 136, [10, 20, 30, 70], f32), small, "float32"),
        # Default block sizes shrink to the small dims (one tile, one block each).
        Case("bf16 default blocks on a tiny shape", _sizes_args(48, 64, 128, [5, 40, 0], bf16), {}, "bfloat16"),
    ]


TOLERANCES = {
    "float32": Tolerance(5e-4, 1e-5, "f32 MXU passes (Precision.HIGHEST) accumulated in f32 in K blocks: "
                         "summation order alone differs from the reference by ~1e-6 relative to "
                         "sum|terms| (K, rows <= 256 here); 10x headroom"),
    "bfloat16": Tolerance(2e-2, 1e-2, "bf16 inputs are exact in f32 and accumulated in f32, but the output "
                          "is rounded to bf16 (8 bits of mantissa): kernel and reference may round a "
                          "value to neighbouring bf16s, 2^-7 = 0.0078 relative"),
    "bfloat16.grad": Tolerance(0.25, 2e-2, "the output cotangent arrives rounded to bf16 (the output "
                               "dtype) before the backward matmuls, as in the bf16 reference; against "
                               "float64 that is 2^-9 relative per term, summed over a contraction of "
                               "<= 256 unit-variance terms: ~0.03 per sigma, 0.25 is ~8 sigma"),
}

# Production shape: Mixtral-8x7B expert up-projection, 4096 tokens x top-2 = 8192 routed rows,
# d_model 4096, d_ff 14336 sharded 8 ways over the tensor-parallel axis = 1792 columns per chip.
PROD = dict(m=8192, k=4096, n=1792, e=8)
TUNED_FOR = "M 8192 (4096 tokens x top-2) K 4096 N 1792 (14336/8) E 8 bf16"
# JAX's megablox gmm at its best tiling in bench/sweep_grouped_matmul.py (the lowest HBM floor of
# the tilings that fit its default scoped VMEM on v5e).
MEGABLOX_TILING = (1024, 512, 896)

BLOCK_CANDIDATES = (
    BlockSizes(512, 4096, 1792, 128),
    BlockSizes(256, 4096, 1792, 128),
    BlockSizes(1024, 4096, 1792, 128),
    BlockSizes(512, 4096, 1792, 256),
    BlockSizes(512, 4096, 1792, 512),
    BlockSizes(512, 4096, 896, 128),
    BlockSizes(512, 1024, 1792, 128),
)


def ragged_dot_xla(lhs, rhs, group_sizes):
    """What a user writes without a kernel: jax.lax.ragged_dot (libtpu lowers it to its own Mosaic
    ragged-dot kernels)."""
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def dense_masked_xla(lhs, rhs, group_sizes):
    """The other thing users write: every expert on every row, masked (E times the FLOPs)."""
    return reference(lhs, rhs, group_sizes)


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    blocks = blocks or BlockSizes()
    m, k, n, e = PROD["m"], PROD["k"], PROD["n"], PROD["e"]
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((e, k, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((e,), jnp.int32))

    def grouped_matmul_pallas(lhs, rhs, group_sizes):
        return grouped_matmul(lhs, rhs, group_sizes, block_sizes=blocks)

    def megablox_gmm(lhs, rhs, group_sizes):
        from jax.experimental.pallas.ops.tpu.megablox import gmm
        return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=MEGABLOX_TILING)

    return BenchSetup(shape=TUNED_FOR, args=args, kernel=grouped_matmul_pallas, xla=ragged_dot_xla,
                      jax_kernel=megablox_gmm, jax_name=f"megablox gmm tiling={MEGABLOX_TILING}",
                      blocks=blocks.text())


SPEC = KernelSpec(
    name="grouped_matmul",
    title="Grouped matmul over ragged expert groups (MoE), scalar-prefetched visit schedule",
    replaces=("Without it users either run every expert on every row and mask (E times the useful FLOPs: "
              "8x at 8 experts) or call jax.lax.ragged_dot, which libtpu lowers to its own Mosaic "
              "ragged-dot kernels whose cost the static profiler cannot estimate (it aborts on v5e)."),
    signature="grouped_matmul(lhs, rhs, group_sizes, *, block_sizes=None, interpret=False)",
    tuned_for=TUNED_FOR,
    usage=("from tpudiag.kernels.grouped_matmul import grouped_matmul\n"
           "# lhs [M, K] rows sorted by expert, rhs [E, K, N], group_sizes int32 [E] (sum <= M)\n"
           "out = grouped_matmul(lhs, rhs, group_sizes)  # [M, N]; rows past the sum are zero"),
    kernel=grouped_matmul,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=BLOCK_CANDIDATES,
    differentiable=True,
)
