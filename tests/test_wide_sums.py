"""parity/wide_sums.py: a JAX function re-evaluated with its 16-bit sums added in float32, everything
else as it was."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpudiag.parity.wide_sums import widened


def _weight_grad(w, x):
    """The transpose of a broadcast: a bf16 reduce_sum over x's 512 rows that nobody wrote."""
    return jax.grad(lambda w: jnp.sum(w * x))(w)


def test_a_gradient_s_bf16_sum_is_added_in_float32_and_rounded_once():
    w = jnp.ones((4,), jnp.bfloat16)
    x = jnp.full((512, 4), 0.1, jnp.bfloat16)
    exact = 512 * float(x[0, 0])  # 51.25: every term is bf16(0.1), and the sum is a bf16 value
    got = jax.jit(widened(_weight_grad))(w, x)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.full(4, exact))


def test_a_cumsum_is_widened_and_other_values_keep_their_dtype():
    x = jnp.full((512,), 0.1, jnp.bfloat16)

    def f(x):
        c = jnp.cumsum(x)
        return c, x * x  # the product stays bf16: only sums are widened

    (c, sq), (c0, sq0) = jax.jit(widened(f))(x), jax.jit(f)(x)
    assert float(c[-1]) == 512 * float(x[0])
    assert sq.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(sq, np.float32), np.asarray(sq0, np.float32))


def test_float32_functions_and_pytrees_pass_through_unchanged():
    def f(tree):
        return {"s": jnp.sum(tree["a"]), "m": tree["a"] @ tree["b"]}

    r = np.random.default_rng(0)
    tree = {"a": jnp.asarray(r.standard_normal((8, 8)), jnp.float32),
            "b": jnp.asarray(r.standard_normal((8, 3)), jnp.float32)}
    got, want = jax.jit(widened(f))(tree), jax.jit(f)(tree)
    assert set(got) == {"s", "m"}
    for k in got:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
