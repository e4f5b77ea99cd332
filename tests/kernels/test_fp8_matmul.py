"""The FP8 kernel (tpudiag/kernels/fp8_matmul.py) beyond `kernels verify`'s cases: both modes against
numpy in float64 (the e4m3 values from ml_dtypes, the per-token quantization worked out by hand), a
row whose values exceed e4m3's range quantizes without NaN, a zero row stays zero, and bad inputs
are refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tests.kernels.test_tiling import _pallas_calls
from tpudiag.kernels import fp8_matmul as f
from tpudiag.kernels.quant_streamed import streams
from tpudiag.kernels.w8a8_matmul import QUANT_CHUNKS


def _args(m, k, n, dtype, seed=0):
    return f._make(m, k, n, dtype, zero_row=True)(jax.random.key(seed))


def _numpy(x, w, s, activations):
    """float64 numpy: the e4m3 weights as values; in fp8 mode x quantized per row in f32 (the op's
    definition) and rounded to e4m3 by ml_dtypes."""
    x32 = np.asarray(x, np.float32)
    wv = np.asarray(w).astype(np.float64)
    if activations == "fp8":
        amax = np.abs(x32).max(axis=1, keepdims=True)
        sx = np.where(amax > 0, amax / np.float32(448.0), np.float32(1.0)).astype(np.float32)
        xq = np.clip(x32 / sx, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        return (xq @ wv) * sx.astype(np.float64) * np.asarray(s, np.float64)[None, :]
    return (x32.astype(np.float64) @ wv) * np.asarray(s, np.float64)[None, :]


@pytest.mark.parametrize("activations", ["fp8", "bf16"])
def test_both_modes_match_numpy_in_float64(activations):
    x, w, s = _args(70, 384, 260, jnp.float32)
    got = f.fp8_matmul(x, w, s, activations=activations, block_sizes=f.BlockSizes(32, 128), interpret=True)
    want = _numpy(x, w, s, activations)
    assert got.dtype == jnp.float32 and got.shape == (70, 260)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)
    assert not np.any(np.asarray(got)[35])  # the zero row


def test_the_activation_quantization_loses_what_e4m3_loses():
    """fp8 mode against weight-only on the same inputs: they differ (x is rounded to 3 mantissa
    bits), by about e4m3's relative step, not more."""
    x, w, s = _args(64, 512, 256, jnp.float32, seed=1)
    a = np.asarray(f.fp8_matmul(x, w, s, activations="fp8", interpret=True), np.float64)
    b = np.asarray(f.fp8_matmul(x, w, s, activations="bf16", interpret=True), np.float64)
    rel = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert 1e-3 < rel < 2 ** -4


def test_quantization_clips_instead_of_making_nan():
    x = jnp.array([[0.0, 0.0], [1.0, -2.0], [1e30, -3e29]], jnp.float32)
    xq, scale = f.quantize_rows_fp8(x)
    assert xq.dtype == jnp.float8_e4m3fn
    v = np.asarray(xq.astype(jnp.float32))
    assert np.all(np.isfinite(v)) and np.abs(v).max() == 448.0
    np.testing.assert_array_equal(v, [[0, 0], [224, -448], [448, -128]])
    np.testing.assert_allclose(np.asarray(scale)[:, 0], [1.0, 2.0 / 448, 1e30 / 448], rtol=1e-6)


def test_rows_at_float32s_smallest_normals_stay_finite_and_match_xla():
    """amax / 448 of a row at float32's smallest normals is subnormal, which XLA:CPU and the TPU
    flush to 0: x / 0 made the row inf and its output NaN. The scale is floored at the smallest
    normal; the kernel then gives XLA's own quantized matmul, bit for bit."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[:8] *= np.float32(2e-38) / np.abs(x[:8]).max(axis=1, keepdims=True)
    x = jnp.asarray(x)
    _, scale = f.quantize_rows_fp8(x)
    assert np.asarray(scale).min() >= np.finfo(np.float32).tiny
    w = jnp.asarray(rng.uniform(-448, 448, (256, 128)), jnp.float32).astype(jnp.float8_e4m3fn)
    ws = jnp.ones((128,), jnp.float32)
    out = f.fp8_matmul(x, w, ws, interpret=True)
    assert np.all(np.isfinite(np.asarray(out))) and np.abs(np.asarray(out[:8])).max() > 0
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(f.xla_fp8_matmul)(x, w, ws)))


def test_bad_inputs_are_refused_by_name():
    x = jnp.zeros((4, 8), jnp.bfloat16)
    w = jnp.zeros((8, 16), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="w must be float8_e4m3fn"):
        f.fp8_matmul(x, jnp.zeros((8, 16), jnp.int8), jnp.ones(16), interpret=True)
    with pytest.raises(ValueError, match="contraction dims differ"):
        f.fp8_matmul(jnp.zeros((4, 9), jnp.bfloat16), w, jnp.ones(16), interpret=True)
    with pytest.raises(ValueError, match=r"w_scale must be \[N=16\]"):
        f.fp8_matmul(x, w, jnp.ones(8), interpret=True)
    with pytest.raises(ValueError, match="activations must be one of"):
        f.fp8_matmul(x, w, jnp.ones(16), activations="int8", interpret=True)
    with pytest.raises(ValueError, match="block_m must be a positive multiple of 32"):
        f.BlockSizes(block_m=48)


def test_the_bench_mode_follows_the_chip_table():
    """e4m3 x e4m3 where the chip table gives the MXU an fp8 rate (v5e, v5p, v6e, TPU7x: twice bf16
    there), weight-only on v4, whose MXU takes no fp8 operand."""
    from tpudiag.targets import CHIPS

    assert CHIPS["v4"].peak_fp8_flops_per_s is None
    assert CHIPS["tpu7x"].peak_fp8_flops_per_s == 2 * CHIPS["tpu7x"].peak_bf16_flops_per_s
    assert {name: f.mode_for(chip) for name, chip in CHIPS.items()} == {
        "v4": "bf16", "v5e": "fp8", "v5p": "fp8", "v6e": "fp8", "tpu7x": "fp8"}
    assert "weight-only" in f.bench(chip=CHIPS["v4"]).shape and "e4m3 per token" in f.bench(chip=CHIPS["v6e"]).shape


def test_v5e_quantizes_x_once_below_a_prefill_chunk():
    """On v5e the fp8 mode's x is quantized once (one chain of N blocks) below a prefill chunk; other
    chips, the weight-only mode and a prefill chunk keep their blocks."""
    from tpudiag.targets import CHIPS

    v5e = CHIPS["v5e"]
    assert f.blocks_for(256, v5e) == f.V5E_FP8_BLOCKS and f.V5E_FP8_BLOCKS.x_chains == 1
    assert "x_chains=1, stream_chunks=4" in f.bench(chip=v5e, m=256).blocks
    # at Llama 3 8B's and 70B's projections the kernel copies x and the weight tiles itself
    for m, k, n in ((256, 4096, 14336), (1, 4096, 14336), (64, 8192, 3584), (512, 4096, 14336)):
        assert streams(f.V5E_FP8_BLOCKS, m, k, n, QUANT_CHUNKS), (m, k, n)
        setup = f.bench(chip=v5e, m=m, shape={"k": k, "n": n})
        (eqn,) = _pallas_calls(jax.make_jaxpr(setup.kernel)(*setup.args).jaxpr)
        assert "dma_start" in str(eqn.params["jaxpr"]), (m, k, n)
    assert f.blocks_for(256, CHIPS["v6e"]) == f.blocks_for(256) == f.DEFAULT_BLOCKS
    assert f.blocks_for(2048, v5e).block_m == 512 and f.blocks_for(2048, v5e).x_chains == 0
    assert f.blocks_for(256, v5e, activations="bf16") == f.DEFAULT_BLOCKS


def test_the_fp8_mode_with_the_kernels_own_copies_is_the_pipelined_kernel_bit_for_bit():
    """v5e's fp8 blocks' path (x bf16, one chain, x and the weight tiles copied by the kernel) at a small
    shape, each copy landing only at its wait, on two cores: the pipelined chain's result, bit for bit."""
    from tests.kernels.test_w8a8_matmul import ON_WAIT, _races_found

    x, w, s = f._make(64, 2048, 512, jnp.bfloat16, outlier=True)(jax.random.key(3))
    streamed = f.BlockSizes(64, 128, x_chains=1, stream_chunks=4)
    got = f.fp8_matmul(x, w, s, block_sizes=streamed, interpret=ON_WAIT)
    assert not _races_found()
    want = f.fp8_matmul(x, w, s, block_sizes=f.BlockSizes(64, 128, x_chains=1), interpret=True)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
