"""Attention masks, read from the optimized HLO XLA:CPU compiles for small attentions written here in
the ways model code writes them: the mask's own ops are evaluated, so each spelling gives its kind
(none, causal, a window with its width, one from the inputs, other), and the snippet keeps the mask
(causal, or causal with the window's width) or prices nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.analyze.suggest.detectors import find_patterns
from tpudiag.analyze.suggest.detectors.masks import classify
from tpudiag.parse.hlo import parse_hlo_text

B, H, S, D = 1, 4, 128, 64
NEG = jnp.finfo(jnp.float32).min


def _attend(scores_fn):
    def f(q, k, v, lengths):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(D)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores_fn(s, lengths), axis=-1), v)
    return f


_q, _k = np.arange(S)[:, None], np.arange(S)[None, :]
PROGRAMS = {
    "none": _attend(lambda s, n: s),
    "causal_tril": _attend(lambda s, n: jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)),
    "causal_bias": _attend(lambda s, n: s + jax.lax.select(jnp.arange(S)[None, :] <= jnp.arange(S)[:, None],
                                                             jnp.zeros((S, S)), jnp.full((S, S), NEG))),
    "window_32": _attend(lambda s, n: jnp.where((jnp.arange(S)[None, :] <= jnp.arange(S)[:, None])
                                                & (jnp.arange(S)[None, :] > jnp.arange(S)[:, None] - 32), s, -1e9)),
    # built with numpy at trace time: a constant the dump prints as `{...}`, so it cannot be read
    "numpy_window": _attend(lambda s, n: jnp.where((_k <= _q) & (_k > _q - 32), s, -1e9)),
    "padding": _attend(lambda s, n: jnp.where(jnp.arange(S)[None, None, None, :] < n[:, None, None, None], s, -1e9)),
    "alibi": _attend(lambda s, n: s - 0.5 * jnp.abs(jnp.arange(S)[None, :] - jnp.arange(S)[:, None])),
    # packed sequences, as MaxText masks them: causal and within one segment (ids from the inputs)
    "segments_causal": _attend(lambda s, n: jnp.where(
        (jnp.arange(S)[None, :] <= jnp.arange(S)[:, None])
        & ((jnp.arange(S)[None, :] >= n[:, None])[:, None, :, None] == (jnp.arange(S)[None, :] >= n[:, None])[:, None, None, :]),
        s, -1e9)),
}
KINDS = {"none": ("none", 0), "causal_tril": ("causal", 0), "causal_bias": ("causal", 0), "window_32": ("window", 32),
         "numpy_window": ("unknown", 0), "padding": ("inputs", 0), "alibi": ("other", 0),
         "segments_causal": ("inputs", 0)}


def _matches(name):
    x = jax.ShapeDtypeStruct((B, H, S, D), jnp.float32)
    text = jax.jit(PROGRAMS[name]).lower(x, x, x, jax.ShapeDtypeStruct((B,), jnp.int32)).compile().as_text()
    return [m for m in find_patterns(parse_hlo_text(text)) if m.pattern == "attention"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_mask_spelling_reads_as_its_kind(name):
    (att,) = _matches(name)
    kind, window = KINDS[name]
    assert (att.shapes.mask, att.shapes.mask_window) == (kind, window), att.notes


def test_a_mask_from_the_inputs_says_what_it_is_where_they_mask_nothing():
    (seg,) = _matches("segments_causal")
    assert any("causal mask where the inputs mask nothing" in n for n in seg.notes), seg.notes
    (pad,) = _matches("padding")  # keys < 1 only: neither causal nor a window
    assert not any("where the inputs mask nothing" in n for n in pad.notes), pad.notes


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_snippet_keeps_the_mask_or_prices_nothing(name):
    from tpudiag.analyze.suggest.detectors.attention import PREFILL
    from tpudiag.kernels.at_shapes import setup_for

    (att,) = _matches(name)
    setup = setup_for(PREFILL, att.shapes, att.notes)
    kind = KINDS[name][0]
    if kind in ("none", "causal"):
        assert f"causal={kind == 'causal'}" in setup.snippet
    elif kind == "window":  # a sliding window flash_attention takes: causal with its width
        assert f"causal=True, window={KINDS[name][1]}" in setup.snippet
    else:  # a mask flash_attention cannot express: a reason, never a snippet that drops it
        assert isinstance(setup, str) and "would drop or change" in setup


def test_classify_reads_offsets_and_windows():
    q, k = np.arange(8)[:, None], np.arange(16)[None, :]
    assert classify(np.ones((8, 16), bool)).kind == "none"
    m = classify(k <= q + 8)  # decode-style: 8 queries at the end of 16 keys
    assert (m.kind, m.offset) == ("causal", 8)
    m = classify((k <= q + 8) & (k > q + 8 - 4))
    assert (m.kind, m.window, m.offset) == ("window", 4, 8)
    assert classify(np.eye(8, 16, dtype=bool) | (k == 0)).kind == "other"



def test_one_sequence_decode_whose_scores_lose_the_batch_reads_its_length_mask(tmp_path):
    # Compiled for v6e, XLA drops the batch of one from an absorbed MLA decode and lays its scores
    # out [keys, heads]: no query axis before the keys. The compile (whose report reads the
    # patterns) goes through, and the length mask is read as one query row.
    import tpudiag
    from tpudiag.kernels.mla_decode import PROD_SCALE, xla_mla_decode
    from tpudiag.parse.hlo import read_hlo_file

    sds = jax.ShapeDtypeStruct
    args = (sds((1, 128, 640), jnp.bfloat16), sds((512, 16, 640), jnp.bfloat16), sds((1,), jnp.int32),
            sds((1, 128), jnp.int32))
    res = tpudiag.compile(lambda q, kv, n, t: xla_mla_decode(q, kv, n, t, latent=512, sm_scale=PROD_SCALE),
                          *args, target="v6e", out=tmp_path / "run", static_profile=False, jobs=1)
    (module,) = res.report.modules
    assert module.status == "ok"
    hlo = read_hlo_file(next((tmp_path / "run").rglob("optimized.hlo.txt")))
    (att,) = [m for m in find_patterns(hlo) if m.pattern.startswith("attention")]
    assert att.shapes.q_len == 1 and att.shapes.kv_len == 2048 and att.shapes.mask == "inputs"


def test_a_mask_broadcast_over_heads_is_read_from_its_plane_and_one_that_varies_is_not():
    """[B, KVH, G, S, S] views of a [B, 1, 1, S, S] mask: the plane where every batch row holds the
    same causal matrix; None where one sequence's differs (padding)."""
    from tpudiag.analyze.suggest.detectors.masks import _keep_of

    causal = np.tril(np.ones((S, S), bool))
    same = np.broadcast_to(np.stack([causal] * 4)[:, None, None], (4, 8, 2, S, S))
    assert np.array_equal(_keep_of(same, 3, 4), causal) and classify(_keep_of(same, 3, 4)).kind == "causal"
    padded = np.stack([causal] * 4)
    padded[2, :, S - 3:] = False
    assert _keep_of(np.broadcast_to(padded[:, None, None], (4, 8, 2, S, S)), 3, 4) is None
    # keys before queries (a backward's transposed frame): the same plane, transposed
    assert np.array_equal(_keep_of(np.moveaxis(same, 4, 3), 4, 3), causal)
