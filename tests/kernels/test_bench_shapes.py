"""The serving kernels' bench setups at other real models' shapes (`bench(shape=...)`, what
bench/sweep_serving.py runs): the arguments follow the shape, every variant traces at it, and a
field the kernel does not have is refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tpudiag.kernels import fp8_matmul, fused_moe, int4_matmul, mla_decode, ragged_paged_attention, w8a8_matmul
from tpudiag.kernels.spec import at_shape


def _variants(setup):
    out = [("kernel", setup.kernel), ("xla", setup.xla)]
    return out + ([("jax", setup.jax_kernel)] if setup.jax_kernel else [])


def _traces(setup):
    """Each variant's output shapes, traced (not compiled) at its own arguments."""
    return {v: jax.tree.map(lambda a: a.shape, jax.eval_shape(fn, *setup.args_for(v))) for v, fn in _variants(setup)}


def test_at_shape_replaces_fields_and_refuses_unknown_ones_by_name():
    prod = {"k": 4096, "n": 14336}
    assert at_shape(prod, {"n": 3584}) == {"k": 4096, "n": 3584}
    assert at_shape(prod, None) == prod
    with pytest.raises(ValueError, match=r"unknown shape field\(s\) heads; this kernel's are k, n"):
        at_shape(prod, {"heads": 8})
    with pytest.raises(ValueError, match="unknown shape field"):
        ragged_paged_attention.bench(shape={"batch": 8})


def test_rpa_decode_batch_and_prefill_chunk_shapes():
    p = ragged_paged_attention.PROD
    decode = ragged_paged_attention.bench(shape={"seqs": 256, "prefill": 1, "tokens": 256})
    q, k_pages, _, kv_lens, table, cu, _ = decode.args
    pps = p["context"] // p["page_size"]
    assert q.shape == (256, p["q_heads"], p["head_dim"])
    assert k_pages.shape == (p["kv_heads"], 256 * pps, p["page_size"], p["head_dim"])
    assert (kv_lens.shape, table.shape, cu.shape) == ((256,), (256, pps), (257,))
    assert "256 decode tokens" in decode.shape
    # ours pads the batch to whole q blocks in its grouped layout
    qg = decode.args_for("kernel")[0]
    assert qg.shape == (p["kv_heads"], 256 * p["q_heads"] // p["kv_heads"], p["head_dim"])
    traced = _traces(decode)
    assert traced["kernel"] == qg.shape and traced["xla"] == traced["jax"] == q.shape

    # a 512-token first chunk has 4 pages: JAX's kernel's pages a block are clipped to them
    prefill = ragged_paged_attention.bench(shape={"seqs": 1, "prefill": 512, "tokens": 512, "context": 512})
    assert "one 512-token prefill chunk" in prefill.shape and "4 pages" in prefill.jax_name
    assert _traces(prefill)["xla"] == (512, p["q_heads"], p["head_dim"])


def test_mla_moe_and_matmul_setups_follow_the_shape():
    mla = mla_decode.bench(shape={"batch": 8, "context": 8192})
    assert mla.args[0].shape[0] == 8 and mla.args[3].shape == (8, 8192 // mla_decode.PROD["page_size"])
    assert set(_traces(mla).values()) == {(8, mla_decode.PROD["heads"], mla_decode.PROD["latent"])}

    moe = fused_moe.bench(shape={"tokens": 256, "d": 256, "f": 128, "e": 16, "top_k": 4})
    assert "T256 D256 F128 E16 top-4" in moe.shape
    assert set(_traces(moe).values()) == {(256, 256)}

    for mod in (w8a8_matmul, int4_matmul):
        s = mod.bench(m=16, shape={"k": 8192, "n": 3584})
        assert s.args[0].shape == (16, 8192) and s.args[1].shape == (8192, 3584) and "M16 K8192 N3584" in s.shape
        assert set(_traces(s).values()) == {(16, 3584)}
    # the blocks column shows the N blocks int4 cuts where they differ from those asked for
    assert int4_matmul.bench(m=64, shape={"k": 8192, "n": 3584}).blocks.endswith("(N in blocks of 896)")
    assert "N in blocks" not in int4_matmul.bench(m=64).blocks
    s = fp8_matmul.bench(activations="bf16", m=8, shape={"k": 8192, "n": 3584})
    assert s.args[1].dtype == jnp.float8_e4m3fn and set(_traces(s).values()) == {(8, 3584)}
