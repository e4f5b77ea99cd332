"""The int4 kernel (tpudiag/kernels/int4_matmul.py) beyond `kernels verify`'s cases: in interpret
mode at f32 it equals the dequantize-then-matmul reference to f32 rounding over several K steps, a
zero-scale group contributes nothing, the K block is whole groups, and bad shapes and blocks are
refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import int4_matmul as q


@pytest.mark.parametrize("group,block_k", [(64, 256), (16, 128)])  # scales as [groups, 1, N]; as [groups, N]
def test_several_k_steps_accumulate_to_the_reference(group, block_k):
    x, w, s = q._make(40, 1024, 260, group, jnp.float32)(jax.random.key(1))
    got = q.int4_matmul(x, w, s, block_sizes=q.BlockSizes(16, 128, block_k), interpret=True)
    want = q.reference(x, w, s)
    assert got.dtype == jnp.float32 and got.shape == (40, 260)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_a_group_with_a_zero_scale_contributes_nothing():
    x, w, s = q._make(16, 512, 128, 128, jnp.float32)(jax.random.key(2))
    s = s.at[1].set(0.0)
    got = q.int4_matmul(x, w, s, interpret=True)
    # oracle: the same product with that group's weights removed, in numpy float64
    wn = np.asarray(w.astype(jnp.float32), np.float64) * np.repeat(np.asarray(s, np.float64), 128, axis=0)
    wn[128:256] = 0.0
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(x, np.float64) @ wn, rtol=1e-4, atol=1e-4)


def test_the_k_block_is_whole_groups_dividing_k():
    assert q._k_block(1024, 4096, 128) == 1024
    assert q._k_block(1024, 3072, 128) == 1024
    assert q._k_block(1024, 1536, 128) == 768  # the largest multiple of 128 dividing 1536, <= 1024
    assert q._k_block(512, 768, 96) == 384  # multiples of lcm(96, 128) = 384
    assert q._k_block(8192, 4096, 128) == 4096  # the whole K
    with pytest.raises(ValueError, match="no K block of at most 128"):
        q._k_block(128, 768, 96)


@pytest.mark.parametrize("shapes,says", [
    (((4, 8), (16, 8), (1, 8)), "contraction dims differ"),
    (((4, 8), (8, 16), (3, 16)), r"scales must be \[K / G, N=16\] with G dividing K=8"),
    (((4, 8), (8, 16), (16,)), r"scales must be \[K / G"),
    (((4,), (8, 16), (1, 16)), "x must be"),
])
def test_bad_shapes_are_refused_by_name(shapes, says):
    xs, ws, ss = shapes
    with pytest.raises(ValueError, match=says):
        q.int4_matmul(jnp.zeros(xs, jnp.bfloat16), jnp.zeros(ws, jnp.int4), jnp.ones(ss, jnp.float32),
                      interpret=True)
    with pytest.raises(ValueError, match="w must be int4"):
        q.int4_matmul(jnp.zeros((4, 8), jnp.bfloat16), jnp.zeros((8, 16), jnp.int8), jnp.ones((1, 16)),
                      interpret=True)


def test_blocks_off_the_tiling_are_refused():
    with pytest.raises(ValueError, match="block_m must be a positive multiple of 16"):
        q.BlockSizes(block_m=24)
    with pytest.raises(ValueError, match="block_k must be a positive multiple of 128"):
        q.BlockSizes(block_k=100)
