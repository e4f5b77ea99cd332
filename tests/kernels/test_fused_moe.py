"""The fused MoE (tpudiag/kernels/fused_moe.py) beyond `kernels verify`'s cases: its routing is
top-k of the logits with renormalized weights (checked against numpy by hand), ties go to the lower
expert, a token routed to one expert gets that expert alone, the kernel agrees with the dense
reference when most experts get no token, the default blocks follow D, the rows are moved by
one-hot matmuls up to ONEHOT_MAX_TOKENS tokens and by gathers above (the two agree), and bad shapes
are refused by name."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import fused_moe as fm
from tpudiag.kernels.grouped_matmul import BlockSizes as Gmm

SMALL = fm.BlockSizes(Gmm(32, 128, 128, 16), Gmm(32, 128, 128, 16))


def test_routing_is_the_top_k_logits_with_renormalized_scores():
    x = jnp.eye(4, dtype=jnp.float32)
    router = jnp.array([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0], [-1.0, 0.0, 2.0, 1.0]])
    w, e = fm.route(x, router, top_k=2)
    # row 1 ties experts 2 and 3: the lower index first; row 2 ties all four: experts 0 and 1
    np.testing.assert_array_equal(np.asarray(e), [[0, 2], [2, 3], [0, 1], [2, 3]])
    logits = np.asarray(router, np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    chosen = np.take_along_axis(p, np.asarray(e), 1)
    np.testing.assert_allclose(np.asarray(w), chosen / chosen.sum(1, keepdims=True), rtol=1e-6)
    ws, _ = fm.route(x, router, top_k=2, scoring="sigmoid", renormalize=False)
    np.testing.assert_allclose(np.asarray(ws), np.take_along_axis(1 / (1 + np.exp(-logits)), np.asarray(e), 1),
                               rtol=1e-6)


def test_a_token_routed_to_one_expert_gets_that_experts_swiglu():
    """top-1 with renormalization: weight 1, so the output is that expert's SwiGLU, computed here by
    numpy in float64 from the same bf16 values."""
    x, r, wg, wu, wd = fm._make(12, 128, 128, 4, jnp.bfloat16)(jax.random.key(1))
    got = np.asarray(fm.fused_moe(x, r, wg, wu, wd, top_k=1, block_sizes=SMALL, interpret=True), np.float64)
    _, e = fm.route(x, r, top_k=1)
    f64 = [np.asarray(a, np.float64) for a in (x, wg, wu, wd)]
    for t, ex in enumerate(np.asarray(e)[:, 0]):
        g, u = f64[0][t] @ f64[1][ex], f64[0][t] @ f64[2][ex]
        h = np.asarray(jnp.asarray(g / (1 + np.exp(-g)) * u).astype(jnp.bfloat16), np.float64)
        np.testing.assert_allclose(got[t], h @ f64[3][ex], atol=4e-2, rtol=2e-2)


def test_experts_with_no_token_are_skipped_and_the_rest_match_the_dense_reference():
    """Every token's experts: fused_moe (interpret) and the dense reference agree to the bf16
    tolerance, including when half the experts get no token (4 tokens x top-2 of 16)."""
    x, r, wg, wu, wd = fm._make(4, 128, 256, 16, jnp.bfloat16)(jax.random.key(2))
    _, e = fm.route(x, r, top_k=2)
    assert len(set(np.asarray(e).ravel())) <= 8  # at most 8 of the 16 experts are read
    got = fm.fused_moe(x, r, wg, wu, wd, top_k=2, block_sizes=SMALL, interpret=True)
    want = fm.reference(x, r, wg, wu, wd, top_k=2)
    tol = fm.TOLERANCES["bfloat16"]
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("change,says", [
    (lambda a: (a[0][:, :64], *a[1:]), r"router_w must be \[D=64, E\]"),
    (lambda a: (*a[:4], a[4][:, :64]), r"w_down must be \[E=4, F=128, D=128\]"),
    (lambda a: (*a[:3], a[3][:2], a[4]), "w_up must be"),
    (lambda a: (a[0].astype(jnp.float32), *a[1:]), "must all be bfloat16 or all float32"),
])
def test_bad_shapes_are_refused_by_name(change, says):
    args = fm._make(8, 128, 128, 4, jnp.bfloat16)(jax.random.key(0))
    with pytest.raises(ValueError, match=says):
        fm.fused_moe(*change(args), top_k=2, interpret=True)
    with pytest.raises(ValueError, match="top_k must be between 1 and the 4 experts"):
        fm.fused_moe(*args, top_k=5, interpret=True)
    with pytest.raises(ValueError, match="scoring must be one of"):
        fm.fused_moe(*args, top_k=2, scoring="relu", interpret=True)
    with pytest.raises(ValueError, match="dispatch must be one of"):
        fm.fused_moe(*args, top_k=2, dispatch="scatter", interpret=True)


def test_the_default_blocks_hold_all_of_d_so_an_experts_weights_are_read_once():
    """Qwen3-30B-A3B's D 2048 keeps the tuned BlockSizes(); at Qwen3-235B-A22B's D 4096 gate/up's K
    block and down's N block grow to all of D (rows of 256), where K blocks of 2048 would fetch every
    expert's weights again for each row tile."""
    assert fm.default_blocks(2048) == fm.BlockSizes()
    big = fm.default_blocks(4096)
    assert (big.gate_up.block_k, big.gate_up.block_n, big.down.block_k, big.down.block_n) == (4096, 768, 768, 4096)
    assert big.gate_up.block_m == big.down.block_m == 256
    assert "block_k=4096" in fm.bench(shape={"d": 4096, "f": 1536}).blocks


def _primitives(fn, *args, **kw) -> set[str]:
    """The primitives named in fn's jaxpr text (nested jaxprs included)."""
    return set(re.findall(r"\b([a-z_]+)\[", str(jax.make_jaxpr(functools.partial(fn, **kw))(*args))))


@pytest.mark.parametrize("t,gathers", [(fm.ONEHOT_MAX_TOKENS, False), (fm.ONEHOT_MAX_TOKENS + 1, True)])
def test_the_rows_move_by_one_hot_matmuls_up_to_the_token_limit_and_by_gathers_above(t, gathers):
    """Up to ONEHOT_MAX_TOKENS tokens the program has no gather and no scatter (the rows move by
    matmuls, the weights ride the sort); above it the row gathers and the inverse permutation's
    scatter are back."""
    sds = jax.ShapeDtypeStruct
    args = (sds((t, 128), jnp.bfloat16), sds((128, 8), jnp.float32), sds((8, 128, 128), jnp.bfloat16),
            sds((8, 128, 128), jnp.bfloat16), sds((8, 128, 128), jnp.bfloat16))
    prims = _primitives(fm.fused_moe, *args, top_k=2, block_sizes=SMALL, interpret=True)
    assert ("gather" in prims) == gathers and ("scatter" in prims) == gathers, sorted(prims)
    assert "dot_general" in prims and "sort" in prims


def test_one_hot_and_gathered_dispatch_give_the_same_layer():
    """The same inputs both ways: the rows are moved exactly either way, the experts are the same
    calls, and the combines differ only in the last bits of f32 (the one-hot combine's weights carry
    16 significant bits), so the bf16 outputs agree to one unit in the last place."""
    args = fm._make(24, 128, 256, 16, jnp.bfloat16)(jax.random.key(5))
    one = fm.fused_moe(*args, top_k=4, block_sizes=SMALL, dispatch="onehot", interpret=True)
    gat = fm.fused_moe(*args, top_k=4, block_sizes=SMALL, dispatch="gather", interpret=True)
    one, gat = np.asarray(one, np.float32), np.asarray(gat, np.float32)
    np.testing.assert_allclose(one, gat, rtol=2 ** -7, atol=1e-6)  # a bf16 ulp is up to 2^-7 relative
    assert np.mean(one == gat) > 0.95


def test_the_sort_carries_each_pairs_weight_and_the_one_hot_combine_keeps_it_past_bf16():
    """sort_pairs' sorted weights are the pairs' own (as a gather by the order would take them);
    the one-hot combine of rows of ones returns each token's weight sum to f32's 2^-16 relative,
    where weights rounded to bf16 would be off by up to 2^-9."""
    rng = np.random.default_rng(0)
    t, k, e = 16, 4, 8
    experts = jnp.asarray(np.stack([rng.permutation(e)[:k] for _ in range(t)]), jnp.int32)
    weights = jnp.asarray(rng.uniform(0.1, 1.0, (t, k)), jnp.float32)
    order, sizes, ws = fm.sort_pairs(experts, e, weights)
    np.testing.assert_array_equal(np.asarray(ws), np.asarray(weights).reshape(-1)[np.asarray(order)])
    np.testing.assert_array_equal(np.asarray(sizes), np.bincount(np.asarray(experts).ravel(), minlength=e))
    ones = jnp.ones((t * k, 128), jnp.bfloat16)
    got = np.asarray(fm.onehot_combine(ones, order, ws, k, t))
    want = np.asarray(weights, np.float64).sum(axis=1)
    np.testing.assert_allclose(got, np.broadcast_to(want[:, None], got.shape), rtol=2 ** -16)
    rounded = np.asarray(weights.astype(jnp.bfloat16), np.float64).sum(axis=1)
    assert np.max(np.abs(rounded - want) / want) > 2 ** -14  # what bf16 weights would have lost


@pytest.mark.parametrize("poison", [jnp.inf, jnp.nan])
def test_a_token_with_a_non_finite_element_spoils_only_its_own_output(poison):
    """A batch where one token holds inf or NaN: that token's output row is NaN, and every other
    token's matches the gathered dispatch (which keeps rows apart) to a bf16 unit in the last place.
    Unguarded, the one-hot matmuls' 0 x inf would reach the other tokens' rows."""
    x, *rest = fm._make(24, 128, 256, 16, jnp.bfloat16)(jax.random.key(6))
    x = x.at[5, 17].set(poison)
    one = np.asarray(fm.fused_moe(x, *rest, top_k=4, block_sizes=SMALL, dispatch="onehot", interpret=True),
                     np.float32)
    gat = np.asarray(fm.fused_moe(x, *rest, top_k=4, block_sizes=SMALL, dispatch="gather", interpret=True),
                     np.float32)
    assert np.isnan(one[5]).all() and not np.isfinite(gat[5]).all()
    others = np.arange(24) != 5
    assert np.isfinite(one[others]).all()
    np.testing.assert_allclose(one[others], gat[others], rtol=2 ** -7, atol=1e-6)
