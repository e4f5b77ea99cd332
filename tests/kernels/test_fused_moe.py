"""The fused MoE (tpudiag/kernels/fused_moe.py) beyond `kernels verify`'s cases: its routing is
top-k of the logits with renormalized weights (checked against numpy by hand), ties go to the lower
expert, a token routed to one expert gets that expert alone, the kernel agrees with the dense
reference when most experts get no token, the default blocks follow D, and bad shapes are refused
by name."""

from __future__ import annotations

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


def test_the_default_blocks_hold_all_of_d_so_an_experts_weights_are_read_once():
    """Qwen3-30B-A3B's D 2048 keeps the tuned BlockSizes(); at Qwen3-235B-A22B's D 4096 gate/up's K
    block and down's N block grow to all of D (rows of 256), where K blocks of 2048 would fetch every
    expert's weights again for each row tile."""
    assert fm.default_blocks(2048) == fm.BlockSizes()
    big = fm.default_blocks(4096)
    assert (big.gate_up.block_k, big.gate_up.block_n, big.down.block_k, big.down.block_n) == (4096, 768, 768, 4096)
    assert big.gate_up.block_m == big.down.block_m == 256
    assert "block_k=4096" in fm.bench(shape={"d": 4096, "f": 1536}).blocks
