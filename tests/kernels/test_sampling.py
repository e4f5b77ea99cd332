"""The top-k / top-p sampling kernel: its verify cases (interpret mode, token ids compared exactly against the
sort-based reference and float64), the reference against a naive float64 loop over the written semantics,
the plain-JAX version against the reference, the margin-keeping case generator, the errors raised before
tracing, and one AOT compile for v5e (f32 and bf16 logits) proving the kernel lowers through Mosaic."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tpudiag
from tpudiag.kernels import sampling as S
from tpudiag.parity.kernel_cases import verify_spec


def test_every_verify_case_passes():
    res = verify_spec(S.SPEC)
    assert res.ok, res.summary()
    assert {c.dtype for c in res.cases} == {"float32", "bfloat16"}
    assert all(case.exact for case in S.SPEC.cases())


def _naive(x, u, k, p, temperature):
    """The module docstring's semantics, one row at a time, in float64 Python."""
    out = []
    for row, ur in zip(x.tolist(), u.tolist()):
        n = len(row)
        t_k = sorted(row, reverse=True)[k - 1] if k is not None and k < n else -math.inf
        in_k = [xj >= t_k for xj in row]
        mx = max(row)
        w = [math.exp((xj - mx) / temperature) if kj else 0.0 for xj, kj in zip(row, in_k)]
        total = sum(w)
        if p < 1.0:
            above = [sum(w[i] for i in range(n) if in_k[i] and row[i] > row[j]) for j in range(n)]
            w = [wj if in_k[j] and above[j] < p * total else 0.0 for j, wj in enumerate(w)]
        target, run = ur * sum(w), 0.0
        pick = n - 1
        for j in range(n):
            run += w[j]
            if run > target:
                pick = j
                break
        out.append(pick)
    return np.array(out)


@pytest.mark.parametrize("k,p,temperature", [(5, 0.7, 0.9), (None, 0.6, 1.3), (1, 1.0, 1.0), (None, 1.0, 2.0),
                                             (12, 1.0, 0.5)])
def test_reference_matches_a_naive_float64_loop(k, p, temperature):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 40))
    x[1, 7] = x[1, 3]  # a tie: both are in or both are out
    u = rng.uniform(size=6)
    with jax.enable_x64():
        got = S.reference(jnp.asarray(x), jnp.asarray(u), k=k, p=p, temperature=temperature)
    np.testing.assert_array_equal(np.asarray(got), _naive(x, u, k, p, temperature))


def test_the_plain_version_agrees_with_the_reference():
    x, u = S._case_args(8, 1500, jnp.float32, 40, 0.85, 0.7)(jax.random.key(5))
    for k, p in ((40, 0.85), (40, 1.0)):
        want = S.reference(x, u, k=k, p=p, temperature=0.7)
        np.testing.assert_array_equal(np.asarray(S.xla_sample(x, u, k=k, p=p, temperature=0.7)), np.asarray(want))


def test_case_inputs_keep_their_distance_from_the_decision_boundaries():
    x, u = S._case_args(8, 500, jnp.float32, 30, 0.9, 1.0)(jax.random.key(9))
    p_dist, u_dist = S._boundary_distances(np.asarray(x), np.asarray(u, np.float64), 30, 0.9, 1.0)
    assert (p_dist >= S._MARGIN).all() and (u_dist >= S._MARGIN).all()
    assert np.isfinite(np.asarray(x)).all() and np.unique(np.asarray(x)).size > 1  # random, never constant


@pytest.mark.parametrize("kw,match", [(dict(block_rows=12), "multiple of 8"), (dict(block_rows=0), "block_rows"),
                                      (dict(lane_candidates=0), "lane_candidates"),
                                      (dict(lane_candidates=33), "lane_candidates"),
                                      (dict(block_rows=16.0), "block_rows")])
def test_block_sizes_validate_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        S.BlockSizes(**kw)


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("x,u,kw,match", [
    (_sds((8,)), _sds((8,)), {}, r"\[batch, vocab\]"),
    (_sds((8, 128), jnp.int32), _sds((8,)), {}, "floating"),
    (_sds((8, 128)), _sds((4,)), {}, r"u must be \[batch=8\]"),
    (_sds((8, 128)), _sds((8,), jnp.int32), {}, "uniform noise"),
    (_sds((8, 128)), _sds((8,)), {"k": 0}, "k must be"),
    (_sds((8, 128)), _sds((8,)), {"p": 0.0}, "p must be"),
    (_sds((8, 128)), _sds((8,)), {"p": 1.5}, "p must be"),
    (_sds((8, 128)), _sds((8,)), {"temperature": 0.0}, "temperature"),
    (_sds((8, 128)), _sds((8,)), {"block_sizes": (8, 8)}, "BlockSizes"),
])
def test_shape_and_parameter_errors_are_value_errors_before_tracing(x, u, kw, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda a, b: S.sample(a, b, **kw), x, u)


def test_aot_compile_for_v5e_lowers_through_mosaic(tmp_path):
    b, v = 24, 5000  # a partial last row block; V neither a multiple of 128 nor of a super-chunk

    def both(x32, x16, u):
        return (S.sample(x32, u, k=50, p=0.9, temperature=0.8),
                S.sample(x16, u, k=50, p=0.9, temperature=0.8))

    res = tpudiag.compile(both, _sds((b, v)), _sds((b, v), jnp.bfloat16), _sds((b,)), target="v5e",
                          out=tmp_path / "run", static_profile=False, jobs=1)
    (mod,) = res.report.to_dict()["modules"]
    assert mod["status"] == "ok", mod["error"]
    calls = sorted(o["bytes_accessed"] for o in mod["ops"] if o["opcode"] == "custom-call")
    # CostEstimate: the logits once, u in, ids out.
    assert calls == [b * v * 2 + b * 8, b * v * 4 + b * 8]
