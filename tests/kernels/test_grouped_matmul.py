"""The grouped matmul kernel: its verify cases (interpret mode against the reference and float64,
gradients included), the reference against a naive float64 loop, the visit schedule's invariants,
the errors raised before tracing, and one AOT compile for v5e proving it lowers through Mosaic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import grouped_matmul as G
from tpudiag.kernels import grouped_matmul_schedule as S
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(G.SPEC, seed=0)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    graded = [c for c in res.cases if any(k.what.startswith("grad[1]") for k in c.checks)]
    assert len(graded) == 2  # lhs and rhs gradients, f32 and bf16


def _naive(lhs, rhs, sizes):
    """Row by row in float64: the row's group by walking the sizes."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    row = 0
    for e, size in enumerate(sizes):
        for r in range(row, min(row + size, lhs.shape[0])):
            out[r] = lhs[r] @ rhs[e]
        row += size
    return out


@pytest.mark.parametrize("sizes", [[3, 0, 7, 2], [0, 0, 0, 0], [12, 0, 0, 0], [0, 5, 0, 0]])
def test_reference_matches_a_naive_float64_loop(sizes):
    k1, k2 = jax.random.split(jax.random.key(4))
    with jax.enable_x64():
        lhs = jax.random.normal(k1, (13, 6), jnp.float64)
        rhs = jax.random.normal(k2, (4, 6, 5), jnp.float64)
        got = G.reference(lhs, rhs, jnp.asarray(sizes, jnp.int32))
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), _naive(lhs, rhs, sizes), rtol=1e-12, atol=1e-12)


def _schedule(sizes, m, bm):
    m_tiles = -(-m // bm)
    make = jax.jit(S.make_schedule, static_argnames=("m", "block_m", "m_tiles"))
    s = np.asarray(make(jnp.asarray(sizes, jnp.int32), m=m, block_m=bm, m_tiles=m_tiles))
    return s.reshape(S.FIELDS, -1), m_tiles


@pytest.mark.parametrize("sizes,m,bm", [([37, 0, 90, 50], 200, 64), ([0, 33, 47, 0, 80], 160, 32),
                                        ([0, 0, 0], 96, 32), ([64, 0, 0], 64, 32), ([5, 5, 5, 5, 5, 5], 64, 16),
                                        ([0, 0, 40], 128, 32)])
def test_the_schedule_covers_every_row_once_and_fetches_nothing_new_for_idle_visits(sizes, m, bm):
    s, m_tiles = _schedule(sizes, m, bm)
    tile, group, ftile, fgroup, lo, hi, flags = s
    assert s.shape[1] == S.num_visits(m_tiles, len(sizes))
    real = (flags & S.REAL) != 0
    compute = (flags & S.COMPUTE) != 0
    # Real visits come first and walk the tiles in order; each tile's first visit is flagged once.
    n_real = int(real.sum())
    assert real[:n_real].all() and not real[n_real:].any()
    assert (np.diff(tile[:n_real]) >= 0).all()
    firsts = tile[(flags & S.TILE_FIRST) != 0]
    assert sorted(firsts) == list(range(m_tiles))
    # Every row below the groups' end is owned by exactly one computing visit on its own tile.
    ends = np.minimum(np.cumsum(sizes), m)
    owners = np.zeros(m, int)
    for v in np.flatnonzero(compute):
        rows = np.arange(max(lo[v], tile[v] * bm), min(hi[v], (tile[v] + 1) * bm))
        assert len(rows) > 0
        owners[rows] += 1
        e = group[v]
        assert lo[v] == (ends[e - 1] if e else 0) and hi[v] == ends[e]
    assert (owners[:ends[-1]] == 1).all() and (owners[ends[-1]:] == 0).all()
    # Each group is opened and closed once (empty ones too: their weight gradient is written as zeros).
    for e in range(len(sizes)):
        assert ((group == e) & ((flags & S.GROUP_FIRST) != 0)).sum() == 1
        assert ((group == e) & ((flags & S.GROUP_LAST) != 0)).sum() == 1
    # A visit that computes nothing fetches what the previous computing visit fetched (no DMA).
    if compute.any():
        last = int(np.flatnonzero(compute)[0])
        for v in range(len(tile)):
            if compute[v]:
                last = v
                assert (ftile[v], fgroup[v]) == (tile[v], group[v])
            else:
                assert (ftile[v], fgroup[v]) == (tile[last], group[last])


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_m=0), "positive"),
    (dict(block_m=40), "multiple of 16"),
    (dict(block_k=200), "multiple of 128"),
    (dict(block_n=64), "multiple of 128"),
    (dict(block_m=256, compute_m=24), "multiple of 16"),
    (dict(block_m=256, compute_m=48), "must divide"),
    (dict(block_m=True), "positive int"),
])
def test_block_sizes_validate_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        G.BlockSizes(**kwargs)


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("args,match", [
    ((_sds((8, 16, 1)), _sds((2, 16, 128)), _sds((2,), jnp.int32)), r"lhs must be \[M, K\]"),
    ((_sds((8, 16)), _sds((16, 128)), _sds((2,), jnp.int32)), r"rhs must be \[E, K, N\]"),
    ((_sds((8, 16)), _sds((2, 32, 128)), _sds((2,), jnp.int32)), "contraction mismatch"),
    ((_sds((8, 16)), _sds((2, 16, 128)), _sds((3,), jnp.int32)), r"group_sizes must be \[E\]"),
    ((_sds((8, 16)), _sds((2, 16, 128), jnp.float32), _sds((2,), jnp.int32)), "must both be bfloat16 or both float32"),
    ((_sds((8, 16), jnp.float16), _sds((2, 16, 128), jnp.float16), _sds((2,), jnp.int32)), "must both be bfloat16"),
    ((_sds((8, 16)), _sds((2, 16, 128)), _sds((2,), jnp.float32)), "group_sizes must be int32"),
])
def test_bad_shapes_and_dtypes_raise_before_tracing_a_kernel(args, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda *a: G.grouped_matmul(*a, interpret=True), *args)


def test_blocks_that_overflow_vmem_are_refused():
    args = (_sds((8192, 16384)), _sds((8, 16384, 4096)), _sds((8,), jnp.int32))
    with pytest.raises(ValueError, match="MiB of VMEM"):
        jax.eval_shape(lambda *a: G.grouped_matmul(*a, block_sizes=G.BlockSizes(2048, 16384, 4096, 128)), *args)


def test_plan_shrinks_blocks_to_small_dims_and_pads_ragged_ones():
    p = G.make_plan((48, 64), (3, 64, 128), G.BlockSizes())
    assert (p.bm, p.bk, p.bn, p.mp, p.kp, p.np_) == (48, 64, 128, 48, 64, 128) and p.cm == 48
    p = G.make_plan((8190, 4096), (8, 4096, 1792), G.BlockSizes())
    assert (p.bm, p.mp, p.bk, p.bn, p.cm) == (512, 8192, 4096, 1792, 128)  # 8190 has no 16-aligned divisor
    p = G.make_plan((8192, 14336), (8, 14336, 1792), G.BlockSizes())
    assert p.bk == 3584 and p.kp == 14336  # a divisor of K rather than a padded copy of the experts


def test_aot_compile_for_v5e_lowers_through_mosaic(tmp_path):
    m, k, n, e = 1024, 512, 256, 4
    args = (_sds((m, k)), _sds((e, k, n)), _sds((e,), jnp.int32))

    def grouped_matmul_small(lhs, rhs, group_sizes):
        return G.grouped_matmul(lhs, rhs, group_sizes, block_sizes=G.BlockSizes(256, 512, 256, 128))

    res = tpudiag.compile(grouped_matmul_small, *args, target="v5e", out=tmp_path / "run",
                          static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = [o for o in mod["ops"] if o["opcode"] == "custom-call"]
    assert len(calls) == 1
    # The kernel's pl.CostEstimate reaches the report: lhs, each expert and out once (the whole K
    # and N in one block), plus the schedule.
    (call,) = calls
    sched_bytes = S.FIELDS * S.num_visits(m // 256, e) * 4
    assert call["bytes_accessed"] == (m * k + e * k * n + m * n) * 2 + sched_bytes
    assert call["flops"] == 2 * S.computed_rows(m, 256, 128, e) * k * n
