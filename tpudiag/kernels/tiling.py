"""Block arithmetic the kernel modules share: rounding, fitting a block to a dimension, the VMEM a
block takes, and the one rule for the scoped VMEM a kernel asks Mosaic for. Pure integer
functions; no jax."""

from __future__ import annotations

# The scoped-VMEM rule, for every Pallas kernel in this package (`vmem_limit` below).
# - Why a kernel sets a limit at all: XLA gives a Mosaic kernel a default scoped VMEM limit of
#   16 MiB (v5e) or 32 MiB (v6e), far below the 128 MiB of VMEM a v5e or v6e TensorCore has
#   (tpudiag/targets.py), and Mosaic rejects at compile time a kernel whose buffers do not fit
#   under the limit it runs with. Tuned blocks (a resident [K, N] expert slice, a whole 128k
#   vocabulary row) need tens of MiB.
# - What it asks for: twice what the blocks need, plus 8 MiB. "Need" is every pipelined block
#   twice (the Pallas pipeline double-buffers each input and output: one buffer computes while
#   the DMA fills the other) plus the scratch_shapes and the large temporaries a kernel makes on
#   purpose. The second copy of that is for Mosaic's own temporaries, which grow with the blocks
#   (an f32 copy of a bf16 block is twice its size; values held across a loop spill); the 8 MiB
#   for its internal scratch and small spills whatever the blocks.
# - Floor 16 MiB: XLA's default on v5e, so small blocks never ask for less than a default compile
#   gives them there, nor for more than a v4 core (16 MiB of VMEM) has.
# - Cap 100 MiB: leaves 28 MiB of a v5e/v6e core's 128 MiB to XLA and the runtime. Blocks that
#   need more than the cap less the 8 MiB are refused with a ValueError when the wrapper is
#   traced, rather than by Mosaic at compile time. v5p has 64 MiB per core: there, pick blocks
#   whose limit stays under that.
VMEM_FLOOR_BYTES = 16 << 20
VMEM_CAP_BYTES = 100 << 20
VMEM_HEADROOM_BYTES = 8 << 20


def round_up(x: int, m: int) -> int:
    """The smallest multiple of m that is >= x."""
    return -(-x // m) * m


def fit_block(block: int, dim: int) -> int:
    """A block at least as large as the dimension becomes the whole dimension: a block equal to the
    full array dim is always a legal TPU block shape, whatever its size, and nothing is padded."""
    return dim if block >= dim else block


def block_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """VMEM bytes one buffer of a block of `shape` takes (squeezed dims left out). Mosaic lays the
    two minor dims out in whole (sublanes x 128-lane) tiles, 8 sublanes of 32-bit words, so 16
    rows of bf16 and 32 of int8 per tile: a [512, 1] f32 column takes 512 x 128 x 4 bytes and a
    [.., 8, 128] bf16 block as much as [.., 16, 128]. An upper bound where Mosaic picks a smaller
    tiling for a thin block."""
    shape = tuple(shape)
    if len(shape) < 2:
        shape = (1,) * (2 - len(shape)) + shape
    sublanes = 8 * max(1, 4 // itemsize)
    n = round_up(shape[-2], sublanes) * round_up(shape[-1], 128) * itemsize
    for d in shape[:-2]:
        n *= d
    return n


def vmem_need(blocks: int, scratch: int = 0) -> int:
    """VMEM a grid step's buffers take: `blocks` is one buffer of every pipelined block (inputs and
    outputs, each `block_bytes`), which the pipeline double-buffers; `scratch` the scratch_shapes
    and any large temporary the kernel makes on purpose (once each)."""
    return 2 * blocks + scratch


def vmem_limit(blocks: int, scratch: int = 0) -> int:
    """`vmem_limit_bytes` for a kernel whose buffers are as in `vmem_need`: twice the need plus
    8 MiB, between 16 MiB and 100 MiB (the rule and its reasons are in the comment above).
    Raises ValueError, naming the MiB, when the blocks cannot fit under the cap."""
    need = vmem_need(blocks, scratch)
    if need + VMEM_HEADROOM_BYTES > VMEM_CAP_BYTES:
        raise ValueError(f"these block sizes need {need / 2**20:.0f} MiB of VMEM, more than the "
                         f"{(VMEM_CAP_BYTES - VMEM_HEADROOM_BYTES) / 2**20:.0f} MiB a kernel may use "
                         "(v5e/v6e have 128 MiB per core): use smaller blocks")
    return int(min(VMEM_CAP_BYTES, max(VMEM_FLOOR_BYTES, 2 * need + VMEM_HEADROOM_BYTES)))
