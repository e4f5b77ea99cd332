"""Block arithmetic the kernel modules share: rounding, fitting a block to a dimension, and the
scoped VMEM a kernel asks Mosaic for. Pure integer functions; no jax."""

from __future__ import annotations


def round_up(x: int, m: int) -> int:
    """The smallest multiple of m that is >= x."""
    return -(-x // m) * m


def fit_block(block: int, dim: int) -> int:
    """A block at least as large as the dimension becomes the whole dimension: a block equal to the
    full array dim is always a legal TPU block shape, whatever its size, and nothing is padded."""
    return dim if block >= dim else block


def scoped_vmem_limit(block_bytes: int) -> int:
    """Scoped VMEM to ask for around double-buffered blocks of `block_bytes`: twice that, half as
    much again for Mosaic's temporaries, and 4 MiB of scratch; at least v5e's 16 MiB default, at
    most 100 MiB (v5e and v6e have 128 MiB per core; v4 only 16 MiB: pass smaller blocks there)."""
    return int(min(100 << 20, max(16 << 20, 3 * block_bytes + (4 << 20))))
