"""Concrete inputs for a kernel's bench setup, for timing it on a chip: random floats and valid
integer metadata (page tables that name distinct pages, full lengths, the token split of a ragged
batch, group sizes that sum to the rows, labels and positions in range) at the setup's
`ShapeDtypeStruct`s. Read by capture/chip_bench.py; the rules per kernel are the bench setups'
argument orders (each kernel module's `bench`)."""

from __future__ import annotations

import numpy as np


def _floats(key, sds, uniform: bool):
    import jax
    import jax.numpy as jnp

    if uniform:  # sampling's uniform draws: in [0, 1)
        return jax.random.uniform(key, sds.shape, jnp.float32).astype(sds.dtype)
    return (jax.random.normal(key, sds.shape, jnp.float32) * 0.5).astype(sds.dtype)


def _ints(name: str, i: int, shape: tuple, shapes: list[tuple], rng):
    """Integer argument `i` of kernel `name` at `shape` (the variant's argument shapes in `shapes`)."""
    import jax.numpy as jnp

    n = len(shapes)
    if name in ("paged_attention", "mla_decode"):  # (..., lengths [B], page table [B, pages per row])
        b, pps = shapes[-1]
        if i == n - 1:
            return jnp.arange(b * pps, dtype=jnp.int32).reshape(b, pps)
        page = shapes[1][-2]
        return jnp.full(shape, pps * page, jnp.int32)
    if name == "ragged_paged_attention.decode":  # at a program's shapes (kernels/at_shapes.py): one token each
        seqs, pps = shapes[n - 3]
        if i == n - 4:  # full lengths in the pool's page size (the pool [KVH, pages, page, D] before them)
            return jnp.full(shape, pps * shapes[n - 5][-2], jnp.int32)
        if i == n - 3:
            return jnp.arange(seqs * pps, dtype=jnp.int32).reshape(seqs, pps)
        if i == n - 2:
            return jnp.arange(seqs + 1, dtype=jnp.int32)
        return jnp.asarray([seqs], jnp.int32)
    if name == "ragged_paged_attention":  # (..., kv_lens, page table, cu_q_lens, num_seqs)
        from tpudiag.kernels.ragged_paged_attention import PROD

        seqs, pps = shapes[n - 3]
        if i == n - 4:
            return jnp.full(shape, pps * PROD["page_size"], jnp.int32)
        if i == n - 3:
            return jnp.arange(seqs * pps, dtype=jnp.int32).reshape(seqs, pps)
        if i == n - 2:  # one prefill chunk, then one decode token per sequence
            q = [PROD["prefill"]] + [1] * (seqs - 1)
            return jnp.asarray(np.concatenate([[0], np.cumsum(q)]), jnp.int32)
        return jnp.asarray([seqs], jnp.int32)
    if name == "grouped_matmul":  # group sizes: the rows split evenly
        return jnp.full(shape, shapes[0][0] // shape[0], jnp.int32)
    if name == "cross_entropy":  # labels in the vocabulary
        return jnp.asarray(rng.integers(0, shapes[0][1], shape), jnp.int32)
    if name == "rope":  # positions 0..S-1
        return jnp.broadcast_to(jnp.arange(shape[-1], dtype=jnp.int32), shape)
    raise ValueError(f"kernel {name}: no rule for its integer argument {i} {shape}")


def bench_inputs(name: str, sds: tuple, key) -> tuple:
    """Arrays for kernel `name`'s bench arguments `sds` (ShapeDtypeStructs), drawn from `key`."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    shapes = [tuple(s.shape) for s in sds]
    out = []
    for i, s in enumerate(sds):
        dt = jnp.dtype(s.dtype)
        k = jax.random.fold_in(key, i)
        if jnp.issubdtype(dt, jnp.floating):
            out.append(_floats(k, s, uniform=name.startswith("sampling") and i == 1))
        elif dt == jnp.int8:
            out.append(jax.random.randint(k, s.shape, -127, 128, jnp.int32).astype(jnp.int8))
        elif dt == jnp.dtype(jnp.int4):
            out.append(jax.random.randint(k, s.shape, -8, 8, jnp.int32).astype(jnp.int4))
        elif dt == jnp.int32:
            out.append(_ints(name, i, tuple(s.shape), shapes, rng))
        else:
            raise ValueError(f"kernel {name}: no rule for a {dt} argument")
    return tuple(out)


def nbytes(sds: tuple) -> int:
    import jax.numpy as jnp

    return sum(int(np.prod(s.shape)) * jnp.dtype(s.dtype).itemsize for s in sds)
