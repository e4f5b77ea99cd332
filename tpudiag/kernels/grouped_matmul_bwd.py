"""The expert-weight gradient of `grouped_matmul`: drhs[e] = lhs_e^T @ g_e over the rows of group e.

Reads the visit schedule built by `grouped_matmul_schedule.make_schedule` (the same one the forward pass
used); returns [E, Kp, Np] with zeros for empty groups. The lhs gradient needs no kernel of its own:
it is the forward kernel contracting N (`gmm_pallas(..., transpose_rhs=True)`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.grouped_matmul_schedule import (COMPUTE, FLAGS, FTILE, GROUP, GROUP_FIRST, GROUP_LAST, HI, LO,
                                                     TILE, computed_rows, keep_in_hbm)
from tpudiag.kernels.tiling import block_bytes, vmem_limit


def tgmm_kernel(sched_ref, lhs_ref, g_ref, out_ref, acc_ref, *, v_max: int, block_m: int, compute_m: int,
                precision):
    """One (K block, N block, visit) step: acc += lhs_rows^T @ g_rows over this visit's rows, in
    `compute_m`-row slices (slices with no row of the group are skipped); the accumulator starts
    at a group's first visit and is stored at its last."""
    v = pl.program_id(2)
    flags = sched_ref[FLAGS * v_max + v]

    @pl.when((flags & GROUP_FIRST) != 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def accumulate(lhs, g):
        # Contract the row dimension of both: lhs^T [bk, cm] @ g [cm, bn], f32 accumulation.
        acc_ref[...] += jax.lax.dot_general(lhs, g, (((0,), (0,)), ((), ())), precision=precision,
                                            preferred_element_type=jnp.float32)

    tile_row = sched_ref[TILE * v_max + v] * block_m
    lo = sched_ref[LO * v_max + v]
    hi = sched_ref[HI * v_max + v]
    compute = (flags & COMPUTE) != 0
    for i in range(block_m // compute_m):
        rows = pl.ds(i * compute_m, compute_m)
        r0 = tile_row + i * compute_m
        touches = compute & (r0 < hi) & (r0 + compute_m > lo)

        @pl.when(touches)
        def _(rows=rows, r0=r0):
            # Zero the other groups' rows in both operands (select, not multiply, so whatever sits
            # in rows past the groups, even inf or nan, cannot leak in). Selects on [cm, bk] and
            # [cm, bn] are VPU work beside the [bk, cm] x [cm, bn] matmul; a separate unmasked
            # branch for slices inside the group would double the kernel's branches.
            def mine(ref):
                x = ref[rows, :]
                r = r0 + jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
                return jnp.where((r >= lo) & (r < hi), x, jnp.zeros_like(x))

            accumulate(mine(lhs_ref), mine(g_ref))

    @pl.when((flags & GROUP_LAST) != 0)
    def _():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def tgmm_pallas(lhs, g, sched, *, e: int, bm: int, bk: int, bn: int, cm: int, v_max: int, out_dtype,
                interpret: bool):
    """lhs [Mp, Kp], g [Mp, Np] (padded to block multiples) -> [E, Kp, Np]."""
    mp, kp = lhs.shape
    np_ = g.shape[1]
    k_tiles, n_tiles = kp // bk, np_ // bn
    isz = jnp.dtype(lhs.dtype).itemsize
    osz = jnp.dtype(out_dtype).itemsize
    # Worst case (every group non-empty, every boundary inside a tile): each computing visit
    # streams its lhs tile once per N block and its g tile once per K block.
    visits = mp // bm + e - 1
    bytes_accessed = (n_tiles * visits * bm * kp + k_tiles * visits * bm * np_) * isz + e * kp * np_ * osz
    cost = pl.CostEstimate(flops=2 * computed_rows(mp, bm, cm, e) * kp * np_, transcendentals=0,
                           bytes_accessed=bytes_accessed + sched.size * 4)
    vmem = vmem_limit(block_bytes((bm, bk), isz) + block_bytes((bm, bn), isz) + block_bytes((bk, bn), osz),
                      scratch=block_bytes((bk, bn), 4))
    precision = jax.lax.Precision.HIGHEST if lhs.dtype == jnp.float32 else None
    kernel = functools.partial(tgmm_kernel, v_max=v_max, block_m=bm, compute_m=cm, precision=precision)
    sched = keep_in_hbm(sched)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((e, kp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(k_tiles, n_tiles, v_max),
            in_specs=[pl.BlockSpec((bm, bk), lambda k, n, v, s: (s[FTILE * v_max + v], k)),
                      pl.BlockSpec((bm, bn), lambda k, n, v, s: (s[FTILE * v_max + v], n))],
            # A group's visits are consecutive, so its output block stays in VMEM until the group ends.
            out_specs=pl.BlockSpec((None, bk, bn), lambda k, n, v, s: (s[GROUP * v_max + v], k, n)),
            scratch_shapes=[pltpu.VMEM((bk, bn), jnp.float32)]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=vmem),
        cost_estimate=cost,
        interpret=interpret,
        name="grouped_matmul_drhs",
    )(sched, lhs, g)
