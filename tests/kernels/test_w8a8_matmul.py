"""The W8A8 kernel (tpudiag/kernels/w8a8_matmul.py) beyond `kernels verify`'s cases: in interpret
mode it equals the plain-JAX w8a8 path bit for bit (the same f32 quantization, exact int32 sums, the
same scale order), a zero row stays zero, and bad shapes and blocks are refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels import w8a8_matmul as q


def _args(m, k, n, dtype, seed=0):
    return q._make(m, k, n, dtype, zero_row=True)(jax.random.key(seed))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_kernel_is_the_plain_jax_w8a8_path_bit_for_bit(dtype):
    x, w, s = _args(70, 384, 260, dtype)
    got = q.w8a8_matmul(x, w, s, block_sizes=q.BlockSizes(32, 128), interpret=True)
    want = q.xla_w8a8_matmul(x, w, s)
    assert got.dtype == x.dtype and got.shape == (70, 260)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert not np.any(np.asarray(got, np.float32)[35])  # the zero row


def test_x_quantized_in_chunks_of_k_is_the_plain_jax_path_bit_for_bit():
    """One M block in two chains of N blocks at K 2048: each chain's first block quantizes x in
    QUANT_CHUNKS chunks of 128 columns, each row's scale from its whole row; the int32 sums are exact,
    so the result is XLA's bit for bit."""
    x, w, s = _args(50, 2048, 512, jnp.float32)
    bs = q.BlockSizes(64, 128, x_chains=2)
    assert q.x_chains(bs, 50, 512) == 2 and 2048 % (q.QUANT_CHUNKS * 128) == 0
    got = q.w8a8_matmul(x, w, s, block_sizes=bs, interpret=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(q.xla_w8a8_matmul(x, w, s)))


def test_quantization_is_symmetric_per_row_and_within_int8():
    x = jnp.array([[0.0, 0.0], [1.0, -2.0], [3e-8, 1e-8]], jnp.float32)
    xq, scale = q.quantize_rows(x)
    assert xq.dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(xq), [[0, 0], [64, -127], [127, 42]])
    np.testing.assert_allclose(np.asarray(scale)[:, 0], [1.0, 2.0 / 127, 3e-8 / 127], rtol=1e-6)


@pytest.mark.parametrize("shapes,says", [
    (((4, 8), (16, 8), (8,)), "contraction dims differ"),
    (((4, 8), (8, 16), (8,)), r"w_scale must be \[N=16\]"),
    (((4,), (8, 16), (16,)), "x must be"),
])
def test_bad_shapes_are_refused_by_name(shapes, says):
    xs, ws, ss = shapes
    with pytest.raises(ValueError, match=says):
        q.w8a8_matmul(jnp.zeros(xs, jnp.bfloat16), jnp.zeros(ws, jnp.int8), jnp.ones(ss, jnp.float32),
                      interpret=True)
    with pytest.raises(ValueError, match="w must be int8"):
        q.w8a8_matmul(jnp.zeros((4, 8), jnp.bfloat16), jnp.zeros((8, 16), jnp.bfloat16), jnp.ones(16), interpret=True)


def test_blocks_off_the_tiling_are_refused():
    with pytest.raises(ValueError, match="block_m must be a positive multiple of 32"):
        q.BlockSizes(block_m=48)
    with pytest.raises(ValueError, match="block_n must be a positive multiple of 128"):
        q.BlockSizes(block_n=100)


def test_a_prefill_chunk_takes_m_blocks_of_512_and_quantizes_x_once_per_block():
    from tpudiag.kernels import fp8_matmul, int4_matmul

    assert q.default_blocks(64) == q.DEFAULT_BLOCKS and q.default_blocks(2048).block_m == 512
    assert int4_matmul.default_blocks(8192).block_m == 512 and "block_m=512" in int4_matmul.bench(m=2048).blocks
    assert "block_m=512" in fp8_matmul.bench(m=2048, activations="fp8").blocks
    assert "block_m=256" in fp8_matmul.bench(m=2048, activations="bf16").blocks  # keeps its upcast tile
    # Several M blocks: x's blocks are quantized into VMEM scratch once, the N axis sequential.
    x, w, s = _args(2048, 256, 384, jnp.bfloat16)
    (eqn,) = [e for e in jax.make_jaxpr(lambda *a: q.w8a8_matmul(*a))(x, w, s).jaxpr.eqns[0].params["jaxpr"].eqns
              if e.primitive.name == "pallas_call"]
    assert eqn.params["grid_mapping"].grid == (4, 1)
    assert [str(v.aval.dtype) for v in eqn.params["jaxpr"].invars[-2:]] == ["int8", "float32"]


@pytest.mark.parametrize("chains,grid,cached", [(2, (2, 2), True), (1, (1, 4), True), (0, (1, 4), False),
                                                (3, (1, 4), False)])  # 4 N blocks do not split in 3
def test_one_m_block_quantizes_x_once_per_chain_of_n_blocks(chains, grid, cached):
    x, w, s = _args(40, 256, 512, jnp.bfloat16)
    bs = q.BlockSizes(64, 128, x_chains=chains)
    assert q.x_chains(bs, 40, 512) == (chains if cached else 0)
    (eqn,) = [e for e in jax.make_jaxpr(lambda *a: q.w8a8_matmul(*a, block_sizes=bs))(x, w, s).jaxpr.eqns[0]
              .params["jaxpr"].eqns if e.primitive.name == "pallas_call"]
    assert eqn.params["grid_mapping"].grid == grid
    scratch = [str(v.aval.dtype) for v in eqn.params["jaxpr"].invars[4:]]
    assert scratch == (["int8", "float32"] if cached else [])
    # each chain covers its own N blocks: the whole output, bit for bit the plain-JAX path's
    got = q.w8a8_matmul(x, w, s, block_sizes=bs, interpret=True)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(q.xla_w8a8_matmul(x, w, s), np.float32))


def test_a_negative_chain_count_is_refused():
    with pytest.raises(ValueError, match="x_chains must be >= 0"):
        q.BlockSizes(x_chains=-1)


def test_a_negative_stream_chunk_count_is_refused():
    with pytest.raises(ValueError, match="stream_chunks must be >= 0"):
        q.BlockSizes(stream_chunks=-1)


def _pallas_eqn(fn, *args):
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns[0].params["jaxpr"].eqns
              if e.primitive.name == "pallas_call"]
    return eqn


def _dma_starts(eqn) -> int:
    return str(eqn.params["jaxpr"]).count("dma_start")


# The TPU interpreter run as a chip would: each copy lands only when it is waited on (a wait misplaced, or
# a buffer read before its copy, reads stale data), two cores, and its race detector on.
ON_WAIT = pltpu.InterpretParams(dma_execution_mode="on_wait", detect_races=True, num_cores_or_threads=2)


def _races_found() -> bool:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call  # the detector's state: no public name

    return bool(interpret_pallas_call.races and interpret_pallas_call.races.races_found)


@pytest.mark.parametrize("m,bs,dtype", [
    (64, q.BlockSizes(64, 128, x_chains=1, stream_chunks=4), jnp.float32),  # one M block, one chain
    (128, q.BlockSizes(64, 128, stream_chunks=4), jnp.float32),  # two M blocks, a chain each
    (128, q.BlockSizes(64, 128, stream_chunks=4), jnp.bfloat16),
])
def test_x_and_the_weight_tiles_copied_by_the_kernel_give_the_pipelined_result_bit_for_bit(m, bs, dtype):
    """With `stream_chunks` the kernel copies x (4 chunks of K), the first weight tile of each chain (4 chunks)
    and the later tiles itself; x is quantized in QUANT_CHUNKS chunks as before, so the result is the
    pipelined kernel's and XLA's, bit for bit, with every N block of each M block in place. Run with each
    copy landing only at its wait, on two cores, and no race found."""
    x, w, s = _args(m, 2048, 512, dtype)
    piped = q.BlockSizes(bs.block_m, bs.block_n, x_chains=bs.x_chains)
    assert q.streams(bs, m, 2048, 512, q.QUANT_CHUNKS) and not q.streams(piped, m, 2048, 512, q.QUANT_CHUNKS)
    eqn = _pallas_eqn(lambda *a: q.w8a8_matmul(*a, block_sizes=bs), x, w, s)
    assert eqn.params["grid_mapping"].grid == (m // 64, 4) and _dma_starts(eqn) > 0
    assert _dma_starts(_pallas_eqn(lambda *a: q.w8a8_matmul(*a, block_sizes=piped), x, w, s)) == 0
    got = np.asarray(q.w8a8_matmul(x, w, s, block_sizes=bs, interpret=ON_WAIT), np.float32)
    assert not _races_found()
    want = np.asarray(q.w8a8_matmul(x, w, s, block_sizes=piped, interpret=True), np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.asarray(q.xla_w8a8_matmul(x, w, s), np.float32))


@pytest.mark.parametrize("m,k,n,chains,why", [
    (100, 2048, 512, 0, "M 100 is not a whole number of 64-row blocks"),
    (64, 2048, 500, 1, "N 500 is not a whole number of 128-column blocks"),
    (64, 1536, 512, 1, "K 1536 is not 16 quantization chunks of whole lanes"),
    (64, 2048, 512, 0, "one M block and no chain: x is quantized at every N block"),
])
def test_blocks_that_do_not_tile_the_operands_keep_the_pipelines_copies(m, k, n, chains, why):
    bs = q.BlockSizes(64, 128, x_chains=chains, stream_chunks=4)
    x, w, s = _args(m, k, n, jnp.bfloat16)
    eqn = _pallas_eqn(lambda *a: q.w8a8_matmul(*a, block_sizes=bs), x, w, s)
    assert _dma_starts(eqn) == 0, why


def test_the_blocks_name_their_stream_chunks_when_set():
    assert str(q.BlockSizes(64, 128, x_chains=1, stream_chunks=4)) == \
        "block_m=64, block_n=128, x_chains=1, stream_chunks=4"
    assert "stream_chunks" not in str(q.BlockSizes())
