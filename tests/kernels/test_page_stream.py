"""The page stream's kernels (paged attention, MLA decode) against a pool whose every position past
each sequence's length is NaN, as an unwritten pool may be: the positions the last block holds past
the length (the last live page's tail and the pages repeating it) must not reach the output
(`page_stream.clear_past_length`). TPU interpret mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import mla_decode as M
from tpudiag.kernels import paged_attention as PA


def _poison(pool, lengths, table, page_axis: int):
    """pool with NaN at every position no sequence holds below its length."""
    pool = np.array(pool, np.float32)
    keep = np.zeros((pool.shape[page_axis], pool.shape[page_axis + 1]), bool)  # [pages, page_size]
    page_size = keep.shape[1]
    for n, row in zip(lengths, table):
        for t in range(int(n)):
            keep[row[t // page_size], t % page_size] = True
    shape = [1] * pool.ndim
    shape[page_axis], shape[page_axis + 1] = keep.shape
    return np.where(keep.reshape(shape), pool, np.nan)


@pytest.mark.parametrize("spec,pools,page_axis", [(PA.SPEC, (1, 2), 1), (M.SPEC, (1,), 0)],
                         ids=["paged_attention", "mla_decode"])
def test_nan_past_each_length_never_reaches_the_output(spec, pools, page_axis):
    case = next(c for c in spec.cases() if c.label == "ragged lengths f32")  # lengths 37, 80, 1; blocks of 32
    args = list(case.make_args(jax.random.key(11)))
    lengths, table = np.asarray(args[pools[-1] + 1]), np.asarray(args[pools[-1] + 2])
    clean = np.asarray(spec.kernel(*args, interpret=True, **case.params))
    for i in pools:
        args[i] = jnp.asarray(_poison(args[i], lengths, table, page_axis), args[i].dtype)
    assert np.isnan(np.asarray(args[pools[0]], np.float32)).any()
    got = np.asarray(spec.kernel(*args, interpret=True, **case.params))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, clean)
