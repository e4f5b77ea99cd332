"""The one scoped-VMEM rule (tpudiag/kernels/tiling.py) against every bundled kernel's real blocks.

The oracle does not ask the kernels what they need: it traces each kernel (and its gradient, where it
has one) at its production shape with every tuned block size, reads the block shapes, memory spaces
and scratch shapes out of each `pallas_call` in the jaxpr, counts them as Mosaic lays them out in
VMEM (each pipelined block twice, the two minor dims padded to whole 8 x 128 tiles of 32-bit words),
and checks the `vmem_limit_bytes` the kernel passed: at least that need plus the headroom, twice it
plus the headroom (up to the ceiling), never under the floor, and never past the core's VMEM less
XLA's share. Tracing only: nothing is compiled (tests/kernels/test_tpu_compile.py compiles).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tpudiag.kernels import tiling
from tpudiag.kernels.registry import all_specs

MIB = 1 << 20


# ----------------------------------------------------------------------------------------- the rule


def test_block_bytes_pads_the_two_minor_dims_to_whole_tiles():
    assert tiling.block_bytes((512, 4096), 2) == 512 * 4096 * 2  # already whole tiles
    assert tiling.block_bytes((512, 1), 4) == 512 * 128 * 4  # a column takes whole 128-lane rows
    assert tiling.block_bytes((8, 128), 2) == 16 * 128 * 2  # bf16 packs 16 rows per tile
    assert tiling.block_bytes((8, 128), 1) == 32 * 128  # int8 32
    assert tiling.block_bytes((1, 4096), 4) == 8 * 4096 * 4
    assert tiling.block_bytes((2, 8, 4, 128), 2) == 2 * 8 * 16 * 128 * 2  # leading dims multiply
    assert tiling.block_bytes((300,), 4) == 8 * 384 * 4  # a 1-D block is one row


def test_balanced_blocks_split_a_dimension_evenly_into_the_fewest_blocks():
    assert tiling.balanced_block(1024, 3584, 128) == 896  # 4 blocks, not 3 of 1024 and an edge of 512
    assert tiling.balanced_block(2048, 3584, 128) == 1792
    assert tiling.balanced_block(1024, 14336, 128) == 1024  # already even
    assert tiling.balanced_block(128, 300, 128) == 128  # no smaller multiple of 128 covers 300 in 3
    assert tiling.balanced_block(1024, 1000, 128) == 1000  # one block: the whole dimension
    for block, dim in [(1024, 3584), (512, 1000), (2048, 14400), (384, 385)]:
        b = tiling.balanced_block(block, dim, 128)
        count = -(-dim // block)
        assert b <= block and b % 128 == 0 and -(-dim // b) == count, (block, dim, b)


def test_vmem_limit_is_twice_the_need_plus_headroom_between_floor_and_ceiling():
    assert tiling.VMEM_BYTES == 128 * MIB  # v5e and v6e, from tpudiag/targets.py
    assert tiling.vmem_need(10 * MIB, 3 * MIB) == 23 * MIB
    assert tiling.vmem_limit(10 * MIB, 3 * MIB) == 2 * 23 * MIB + tiling.VMEM_HEADROOM_BYTES
    assert tiling.vmem_limit(MIB) == tiling.VMEM_FLOOR_BYTES == 16 * MIB
    # need 48 MiB: 104 MiB would be asked; the ceiling leaves the need once more and XLA's 8 MiB
    assert tiling.vmem_limit(24 * MIB) == 128 * MIB - 48 * MIB - tiling.XLA_VMEM_BYTES == 72 * MIB
    assert tiling.fits_vmem(28 * MIB)  # need 56 MiB: limit 64 MiB, 64 + 56 + 8 = 128
    assert not tiling.fits_vmem(28 * MIB + 1)


def test_the_limit_never_leaves_the_core_short():
    for need_mib in range(0, 113):
        blocks = need_mib * MIB // 2
        need, limit = tiling.vmem_need(blocks), tiling.vmem_limit(blocks)
        assert limit >= need + tiling.VMEM_HEADROOM_BYTES, need_mib  # Mosaic compiles the kernel
        assert limit + tiling.XLA_VMEM_BYTES <= tiling.VMEM_BYTES, need_mib  # XLA keeps its buffers
        if tiling.fits_vmem(blocks):  # and the static profile's second count of the need fits too
            assert limit + need + tiling.XLA_VMEM_BYTES <= tiling.VMEM_BYTES, need_mib


def test_blocks_past_the_vmem_are_refused_naming_the_mib():
    assert tiling.vmem_limit(56 * MIB) == 120 * MIB  # need 112 MiB + 8 MiB: just compiles, no room to spare
    with pytest.raises(ValueError, match="need 113 MiB of VMEM, more than the 112 MiB"):
        tiling.vmem_limit(56 * MIB, MIB)
    # a smaller core: v5p has 64 MiB
    with pytest.raises(ValueError, match="more than the 48 MiB"):
        tiling.vmem_limit(25 * MIB, vmem_bytes=64 * MIB)


# ----------------------------------------------------------------------------- every kernel's blocks


def _sublanes(itemsize: int) -> int:
    return {4: 8, 2: 16, 1: 32}[itemsize]  # rows of one (sublanes x 128 lanes) 32-bit-word tile


def _vmem_bytes(aval) -> int:
    shape = tuple(aval.shape)
    shape = (1,) * max(0, 2 - len(shape)) + shape
    rows, cols = shape[-2], shape[-1]
    n = -(-rows // _sublanes(aval.dtype.itemsize)) * _sublanes(aval.dtype.itemsize) * (-(-cols // 128) * 128)
    for d in shape[:-2]:
        n *= d
    return n * aval.dtype.itemsize


def _pallas_calls(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        for v in eqn.params.values():
            for sub in v if isinstance(v, (list, tuple)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _pallas_calls(inner)


def _need(eqn) -> int:
    """Pipelined blocks (DEFAULT memory space: Pallas double-buffers them in VMEM) twice, plus VMEM
    scratch once. Blocks left in HBM (pl.ANY: the kernel DMAs them itself), SMEM and semaphores
    take no VMEM."""
    gm = eqn.params["grid_mapping"]
    blocks = sum(_vmem_bytes(b.block_aval) for b in gm.block_mappings
                 if str(b.block_aval.memory_space) in ("default", "vmem"))
    scratch = sum(_vmem_bytes(a) for a in gm.scratch_avals if str(a.memory_space) == "vmem")
    return 2 * blocks + scratch


def _limit(eqn):
    cp = eqn.params["compiler_params"]
    cp = cp.get("mosaic_tpu", cp) if isinstance(cp, dict) else cp
    return cp.vmem_limit_bytes


def _with_grad(spec, fn, args):
    if not spec.differentiable:
        return fn
    argnums = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))

    def loss(*a):
        return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(fn(*a)))

    return lambda *a: (fn(*a), jax.grad(loss, argnums=argnums)(*a))


def _setups():
    for spec in all_specs():
        for blocks in (None, *spec.block_candidates):
            yield spec, blocks, ""
            if spec.name == "int8_matmul":  # tuned at decode M64 and measured at prefill M2048
                yield spec, blocks, "m2048"


@pytest.mark.parametrize("spec,blocks,variant", list(_setups()),
                         ids=lambda x: x.name if hasattr(x, "bench") else (str(x) if x else "default"))
def test_every_kernel_asks_for_what_its_blocks_need(spec, blocks, variant):
    setup = spec.bench(blocks, m=2048) if variant else spec.bench(blocks)
    jaxpr = jax.make_jaxpr(_with_grad(spec, setup.kernel, setup.args_for("kernel")))(*setup.args_for("kernel"))
    calls = list(_pallas_calls(jaxpr.jaxpr))
    assert calls, "no pallas_call traced"
    for eqn in calls:
        need, limit = _need(eqn), _limit(eqn)
        where = f"{eqn.params['name']}: blocks and scratch need {need / MIB:.2f} MiB, limit {limit}"
        assert limit is not None, where
        assert need <= limit, where
        assert limit >= min(tiling.VMEM_BYTES - need - tiling.XLA_VMEM_BYTES,
                            2 * need + tiling.VMEM_HEADROOM_BYTES), where
        assert limit >= max(tiling.VMEM_FLOOR_BYTES, need + tiling.VMEM_HEADROOM_BYTES), where
        assert limit + tiling.XLA_VMEM_BYTES <= tiling.VMEM_BYTES, where


def test_the_oracle_sees_every_kernel_family():
    traced = set()
    for spec in all_specs():
        setup = spec.bench()
        jaxpr = jax.make_jaxpr(_with_grad(spec, setup.kernel, setup.args_for("kernel")))(*setup.args_for("kernel"))
        traced |= {eqn.params["name"] for eqn in _pallas_calls(jaxpr.jaxpr)}
    # forward and backward kernels alike
    assert {"flash_attention_fwd", "flash_attention_dkv", "flash_attention_dq", "tpudiag_paged_attention",
            "rmsnorm_residual_fwd", "rmsnorm_residual_bwd", "cross_entropy_fwd", "cross_entropy_bwd",
            "topk_topp_sampling", "tpudiag_int8_matmul", "tpudiag_int8_matmul_dx", "grouped_matmul",
            "grouped_matmul_drhs", "tpudiag_w8a8_matmul", "tpudiag_int4_matmul", "tpudiag_mla_decode"} <= traced
    assert traced & {"rope_qk", "rope_qk_adjoint"}


@pytest.mark.parametrize("scale", [1.0, 1e4, 1e-30])
def test_a_float32_dot_by_exact_weights_is_as_accurate_as_highest(scale):
    """Three bf16 terms of x sum to x exactly, and their three products by weights bf16 holds
    exactly (8-bit integers) are as close to float64 as XLA's HIGHEST float32 dot."""
    import numpy as np

    from tpudiag.kernels.tiling import dot_by_exact_weights

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 512)) * scale).astype(np.float32)
    w = rng.integers(-127, 128, (512, 256)).astype(np.int8)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    ours = np.asarray(dot_by_exact_weights(jnp.asarray(x), jnp.asarray(w)), np.float64)
    highest = np.asarray(jnp.dot(jnp.asarray(x), jnp.asarray(w, jnp.float32), precision=jax.lax.Precision.HIGHEST),
                         np.float64)
    err = np.linalg.norm(ours - exact) / np.linalg.norm(exact)
    ref = np.linalg.norm(highest - exact) / np.linalg.norm(exact)
    assert err <= 2 * ref + 1e-7, (err, ref)
    one_pass = np.asarray(jnp.dot(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16),
                                  preferred_element_type=jnp.float32), np.float64)
    assert np.linalg.norm(one_pass - exact) / np.linalg.norm(exact) > 100 * err  # what the split buys
