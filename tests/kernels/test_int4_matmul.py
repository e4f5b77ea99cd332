"""The int4 kernel (tpudiag/kernels/int4_matmul.py) beyond `kernels verify`'s cases: in interpret
mode at f32 it equals the dequantize-then-matmul reference to f32 rounding over several K steps, a
zero-scale group contributes nothing, the K block is whole groups, a few rows of bf16 x go through
exact int8 digits, and bad shapes and blocks are refused by name."""

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


@pytest.mark.parametrize("m,n,dtype,block_n", [
    (64, 3584, jnp.bfloat16, 896), (2048, 3584, jnp.bfloat16, 1792), (2048, 14336, jnp.bfloat16, 2048),
    (1, 14336, jnp.bfloat16, 2048), (16, 3584, jnp.bfloat16, 1792), (1, 14336, jnp.float32, 1024)])
def test_n_is_split_into_even_blocks(m, n, dtype, block_n):
    """Llama 3 70B's projection at TP8 (N 3584): decode in 4 N blocks of 896, a prefill chunk in 2
    of 1792 (blocks of up to 2048: x is fetched again for every N block when K takes two). The int8
    digit kernel (bf16 x, M <= 16) takes N blocks of up to 2048 too; f32 x at M 1 converts its
    weights and keeps the decode blocks."""
    sds = jax.ShapeDtypeStruct
    args = (sds((m, 8192), dtype), sds((8192, n), jnp.int4), sds((64, n), jnp.float32))
    (call,) = [e for e in jax.make_jaxpr(q.int4_matmul)(*args).jaxpr.eqns[0].params["jaxpr"].eqns
               if e.primitive.name == "pallas_call"]
    w_block = [getattr(b, "block_size", b) for b in call.params["grid_mapping"].block_mappings[1].block_shape]
    assert w_block[-1] == block_n and call.params["grid_mapping"].grid[1] == -(-n // block_n)


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


def test_int8_digits_reconstruct_bf16_rows_exactly():
    """Three digits of 7 bits hold a bf16 row exactly down to 2^-12 of its largest magnitude: here
    an outlier of 300 beside values of O(1), a row of zeros, and a row of tiny values."""
    x = jax.random.normal(jax.random.key(3), (3, 256), jnp.float32).astype(jnp.bfloat16)
    x = x.at[0, 5].set(300.0).at[1].set(0.0).at[2].multiply(1e-6)
    digits, scales = q._digits(x.astype(jnp.float32))
    d = np.asarray(digits, np.float64).reshape(3, 3, 256)
    assert digits.dtype == jnp.int8 and np.abs(d).max() <= 64
    back = sum(d[i] * np.asarray(scales[i], np.float64) for i in range(3))
    xs = np.asarray(x, np.float64)
    big = np.abs(xs) >= np.abs(xs).max(axis=1, keepdims=True) * 2.0 ** -12
    assert (back[big] == xs[big]).all() and (back[1] == 0).all()
    assert (np.abs(back - xs) <= np.abs(xs).max(axis=1, keepdims=True) * 2.0 ** -20).all()


def test_a_few_bf16_rows_take_the_int8_digit_kernel_and_round_once():
    """At M 4 (bf16) the kernel multiplies int8 digits on the MXU's int8 path (int32 sums) and its
    result is the float64 product rounded once to bf16, to a unit in the last place; at M 17 it
    converts the weights instead."""
    x, w, s = q._make(4, 512, 256, 128, jnp.bfloat16)(jax.random.key(4))
    x = x.at[0, 9].set(-250.0)

    def int32_dots(m):
        xm = jnp.zeros((m, 512), jnp.bfloat16)
        return "preferred_element_type=int32" in str(jax.make_jaxpr(
            lambda a: q.int4_matmul(a, w, s, interpret=True))(xm))

    assert int32_dots(4) and int32_dots(q.DIGITS_MAX_M) and not int32_dots(q.DIGITS_MAX_M + 1)
    got = np.asarray(q.int4_matmul(x, w, s, interpret=True).astype(jnp.float32), np.float64)
    exact = np.asarray(x, np.float64) @ (np.asarray(w.astype(jnp.float32), np.float64)
                                         * np.repeat(np.asarray(s, np.float64), 128, axis=0))
    ulp = np.abs(np.asarray(jnp.asarray(exact, jnp.float32).astype(jnp.bfloat16), np.float64)) * 2.0 ** -7
    assert (np.abs(got - exact) <= ulp + 1e-30).all()
