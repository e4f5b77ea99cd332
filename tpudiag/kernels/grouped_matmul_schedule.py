"""The visit schedule of `grouped_matmul`: which (row tile, group) pairs the forward and backward
kernels visit, built in jnp from `group_sizes` before the kernels run and scalar-prefetched into
SMEM as one flat int32 array of FIELDS rows.

Shared by the forward kernel (`grouped_matmul.py`) and the expert-weight gradient
(`grouped_matmul_bwd.py`), so neither imports the other's internals. Computes nothing at import.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

# Schedule rows (scalar-prefetched into SMEM as one flat int32 array of FIELDS * num_visits).
TILE, GROUP, FTILE, FGROUP, LO, HI, FLAGS = range(7)
FIELDS = 7
COMPUTE, TILE_FIRST, GROUP_FIRST, GROUP_LAST, REAL = 1, 2, 4, 8, 16


def num_visits(m_tiles: int, num_groups: int) -> int:
    """Static bound on schedule length. With q >= 1 non-empty groups: their visits cover the live
    tiles plus at most q - 1 shared boundary tiles, each of the num_groups - q empty groups takes
    one visit and each dead tile one, so m_tiles + num_groups - 1; with q = 0 it is
    m_tiles + num_groups (every group empty, every tile dead)."""
    return m_tiles + num_groups


def make_schedule(group_sizes, *, m: int, block_m: int, m_tiles: int):
    """The visit schedule, in jnp (runs on device before the kernel): int32 [FIELDS * V].

    Visits go group by group; each non-empty group visits the row tiles it touches, an empty group
    visits one tile (so the backward pass writes its zero gradient), then the tiles past the last
    group are visited to write zeros, then padding repeats the last visit and does nothing. Rows
    [lo, hi) of a visit belong to it. `ftile`/`fgroup` are the tile and expert last *computed*,
    which index_maps fetch, so visits that compute nothing cause no DMA.
    """
    e = group_sizes.shape[0]
    v_max = num_visits(m_tiles, e)
    gidx = jnp.arange(e, dtype=jnp.int32)
    upto = gidx[:, None] >= gidx[None, :]  # [E, E] lower triangle: prefix sums and maxima over
    # groups as one masked reduction (E is small; cheaper to compile than a scan)
    gs = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.sum(jnp.where(upto, gs[None, :], 0), axis=1), m)  # contract: sum <= M
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    total = ends[-1]
    nonempty = ends > starts
    first = jnp.minimum(starts // block_m, m_tiles - 1)
    last = jnp.where(nonempty, (ends - 1) // block_m, first)
    n_vis = last - first + 1
    vis_end = jnp.sum(jnp.where(upto, n_vis[None, :], 0), axis=1)
    vis_start = vis_end - n_vis
    n_group_visits = vis_end[-1]
    live_tiles = (total + block_m - 1) // block_m
    n_real = n_group_visits + (m_tiles - live_tiles)

    v = jnp.arange(v_max, dtype=jnp.int32)
    g = jnp.minimum(jnp.searchsorted(vis_end, v, side="right", method="compare_all"), e - 1).astype(jnp.int32)
    is_g = g[:, None] == gidx[None, :]  # [V, E] one-hot

    def per_visit(x):
        # x[g] as a one-hot select: a gather here would make the TPU static profiler abort on v5e
        # ("Unsupported DMA direction") and take the whole module's cycle estimate with it.
        return jnp.sum(jnp.where(is_g, x[None, :], 0), axis=1)

    in_groups = v < n_group_visits
    real = v < n_real
    dead_tile = live_tiles + v - n_group_visits
    # Padding repeats the last real visit: the last dead tile, else the last group's last tile.
    pad_tile = jnp.where(live_tiles < m_tiles, m_tiles - 1, last[e - 1])
    tile = jnp.where(in_groups, per_visit(first) + v - per_visit(vis_start),
                     jnp.where(real, dead_tile, pad_tile)).astype(jnp.int32)
    group = jnp.where(in_groups, g, e - 1).astype(jnp.int32)  # dead and padding visits: the last group
    lo = jnp.where(in_groups, per_visit(starts), 0)
    hi = jnp.where(in_groups, per_visit(ends), 0)
    compute = in_groups & (per_visit(nonempty.astype(jnp.int32)) != 0)

    prev_tile = jnp.concatenate([jnp.full((1,), -1, jnp.int32), tile[:-1]])
    tile_first = real & (tile != prev_tile)
    group_first = in_groups & (v == per_visit(vis_start))
    group_last = in_groups & (v == per_visit(vis_end) - 1)
    flags = (compute * COMPUTE + tile_first * TILE_FIRST + group_first * GROUP_FIRST
             + group_last * GROUP_LAST + real * REAL).astype(jnp.int32)

    # What to fetch: a computing visit its own tile and expert; any other visit what the last
    # computing visit before it fetched (the last tile of the last non-empty group so far), or the
    # first computing visit's before any has computed. Then the block indices do not change and
    # the pipeline issues no DMA for visits that compute nothing.
    prev_ne = jnp.max(jnp.where(upto & nonempty[None, :], gidx[None, :], -1), axis=1)  # [E]
    first_ne = jnp.argmax(nonempty).astype(jnp.int32)  # 0 when every group is empty
    src_group = jnp.where(in_groups, per_visit(prev_ne), prev_ne[e - 1])
    fgroup = jnp.where(compute, g, jnp.where(src_group >= 0, src_group, first_ne))
    is_f = fgroup[:, None] == gidx[None, :]
    f_first = jnp.sum(jnp.where(is_f, first[None, :], 0), axis=1)
    f_last = jnp.sum(jnp.where(is_f, last[None, :], 0), axis=1)
    ftile = jnp.where(compute, tile, jnp.where(src_group >= 0, f_last, f_first))
    return jnp.concatenate([tile, group, ftile, fgroup, lo, hi, flags]).astype(jnp.int32)


def visit_field(sched_ref, field: int, v, v_max: int):
    return sched_ref[field * v_max + v]


def keep_in_hbm(sched):
    """Pin the schedule to HBM. XLA would otherwise place the small array, computed in the same
    module, in VMEM (S(1)), and the scalar-prefetch copy VMEM->SMEM is a DMA direction the TPU
    static profiler rejects on v5e ("Unsupported DMA direction: 10 on VL/VLP"), losing the whole
    module's cycle estimate. From HBM it is the ordinary copy into SMEM."""
    return pltpu.with_memory_space_constraint(sched, pltpu.HBM)


def computed_rows(mp: int, bm: int, cm: int, e: int) -> int:
    """Rows the MXU multiplies at most: every row once, plus one `compute_m` slice per group
    boundary that falls inside a slice (both groups multiply it), capped by whole-tile visits."""
    return min(mp + (e - 1) * cm, (mp // bm + e - 1) * bm)
