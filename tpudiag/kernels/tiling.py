"""Block arithmetic the kernel modules share: rounding, fitting a block to a dimension, the VMEM a
block takes, and the one rule for the scoped VMEM a kernel asks Mosaic for. Pure integer
functions, no jax, except three a kernel body calls: `mxu_precision` (the dot precision of its
operands), `precise_log` and `dot_by_exact_weights` (a float32 dot by weights bf16 holds exactly).
Reads the VMEM size per TensorCore from tpudiag/targets.py."""

from __future__ import annotations

from tpudiag.targets import CHIPS

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
# - Ceiling: VMEM less the need once more, less 8 MiB for XLA's own buffers. XLA reserves the
#   whole limit for the kernel and places its own VMEM buffers above it, and the TPU compiler's
#   static-profile pass (what `tpudiag kernels bench` compiles with) then counts the kernel's
#   allocations again on top. Measured, libtpu 0.0.42 and 0.0.50.1, rope at B1 S8192 H32 KVH8
#   D128 on v5e: a 100 MiB limit, XLA's 4 MiB copy of the positions above it and the kernel's
#   24.07 MiB (20 MiB of windows, 4.07 MiB of spill slots) fail with "Used 128.07M of 128.00M
#   vmem"; a 99 MiB limit compiles (0.0.50.1), as does the same module at 100 MiB without the
#   static profile (program VMEM 104 MiB). So limit + need + 8 MiB stays within the core's VMEM.
#   No limit protects a whole program's static profile: XLA fills the VMEM above the limit with
#   its own buffers when it has the ops to (rope's forward and gradient at a 57 MiB limit: 125 MiB
#   of program VMEM, "Used 149.09M of 128.00M" with the static profile, fine without).
# - Floor 16 MiB: XLA's default on v5e, so small blocks never ask for less than a default compile
#   gives them there, nor for more than a v4 core (16 MiB of VMEM) has. And never under the need
#   plus 8 MiB, which Mosaic needs to compile the kernel at all: blocks whose need is past half
#   the VMEM (less the two 8 MiB) get that, which compiles but leaves the static profile no room
#   (`fits_vmem` says whether blocks are under that line; kernels that pick their own blocks halve
#   them until they are).
# - Refused: blocks whose need plus 8 MiB is more than the VMEM less XLA's 8 MiB, with a
#   ValueError when the wrapper is traced, rather than by Mosaic at compile time.
# - Which VMEM: the smallest of the chips the kernels are tuned for (`TUNED_FOR`), 128 MiB. A
#   kernel is traced before the target is known. Compiling for a chip with less (v5p: 64 MiB, v4:
#   16 MiB per core), libtpu lowers a larger limit to what the core has (measured, libtpu 0.0.50.1:
#   every bundled kernel compiles for v5p at its default blocks, rope's program VMEM 63.94 MiB);
#   there, pick blocks that fit.
TUNED_FOR = ("v5e", "v6e")
VMEM_BYTES = min(CHIPS[name].vmem_bytes for name in TUNED_FOR)
VMEM_FLOOR_BYTES = 16 << 20
VMEM_HEADROOM_BYTES = 8 << 20  # Mosaic's internal scratch and small spills, inside the limit
XLA_VMEM_BYTES = 8 << 20  # XLA's own VMEM buffers, outside the limit (rope's positions copy: 4 MiB)


def round_up(x: int, m: int) -> int:
    """The smallest multiple of m that is >= x."""
    return -(-x // m) * m


def fit_block(block: int, dim: int) -> int:
    """A block at least as large as the dimension becomes the whole dimension: a block equal to the
    full array dim is always a legal TPU block shape, whatever its size, and nothing is padded."""
    return dim if block >= dim else block


def balanced_block(block: int, dim: int, multiple: int) -> int:
    """The block that splits `dim` into as few blocks of at most `block` as fit, as evenly as a
    multiple of `multiple` allows: N 3584 in blocks of at most 1024 takes 4 of 896 rather than 3 of
    1024 and an edge of 512 computed as 1024. The whole dimension where `block` covers it."""
    if block >= dim:
        return dim
    count = -(-dim // block)
    return min(block, round_up(-(-dim // count), multiple))


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


def fits_vmem(blocks: int, scratch: int = 0, vmem_bytes: int = VMEM_BYTES) -> bool:
    """Whether `vmem_limit` can give these buffers their need plus the headroom while the limit, the
    need counted again and XLA's buffers stay within `vmem_bytes` (the rule above): what a kernel
    that picks its own blocks halves them until."""
    need = vmem_need(blocks, scratch)
    return need + VMEM_HEADROOM_BYTES <= vmem_bytes - need - XLA_VMEM_BYTES


def vmem_limit(blocks: int, scratch: int = 0, vmem_bytes: int = VMEM_BYTES) -> int:
    """`vmem_limit_bytes` for a kernel whose buffers are as in `vmem_need`: twice the need plus
    8 MiB, at most `vmem_bytes` less the need and XLA's 8 MiB, at least 16 MiB and the need plus
    8 MiB (the rule and its reasons are in the comment above). Raises ValueError, naming the MiB,
    when the blocks cannot fit in `vmem_bytes` at all."""
    need = vmem_need(blocks, scratch)
    usable = vmem_bytes - XLA_VMEM_BYTES
    if need + VMEM_HEADROOM_BYTES > usable:
        raise ValueError(f"these block sizes need {need / 2**20:.0f} MiB of VMEM, more than the "
                         f"{(usable - VMEM_HEADROOM_BYTES) / 2**20:.0f} MiB a kernel may use "
                         f"of the {vmem_bytes / 2**20:.0f} MiB of VMEM per core: use smaller blocks")
    ceiling = vmem_bytes - need - XLA_VMEM_BYTES
    wanted = max(VMEM_FLOOR_BYTES, 2 * need + VMEM_HEADROOM_BYTES)
    return int(max(need + VMEM_HEADROOM_BYTES, min(ceiling, wanted)))


def check_multiples(blocks, rules: tuple[tuple[str, int], ...]) -> None:
    """Refuse a block-size dataclass whose fields are not positive multiples of their tile: `rules`
    is (field, multiple) pairs. Raises ValueError naming the field."""
    for name, mult in rules:
        v = getattr(blocks, name)
        if not isinstance(v, int) or v <= 0 or v % mult:
            raise ValueError(f"{name} must be a positive multiple of {mult}, got {v!r}")


def check_matmul_operands(x, w, w_dtype) -> None:
    """x [M, K] floating point @ w [K, N] of `w_dtype`: raises ValueError naming what is off."""
    import jax.numpy as jnp

    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x must be [M, K] and w [K, N], got {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"contraction dims differ: x {x.shape} vs w {w.shape}")
    if w.dtype != w_dtype:
        raise ValueError(f"w must be {jnp.dtype(w_dtype).name}, got {w.dtype}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be floating point, got {x.dtype}")


def precise_log(x):
    """log(x) in f32 to about exp's accuracy: one Newton step, y + x * exp(-y) - 1, on the chip's log.
    On a v5e (Mosaic and XLA alike) f32 log is up to 1e-4 off for x in [1, 300] and exp 5e-6
    relative (measured against float64); a log-sum-exp saved for a backward pass carries the log's
    error into every probability of its row."""
    import jax.numpy as jnp

    y = jnp.log(x)
    return y + (x * jnp.exp(-y) - 1.0)


def mxu_precision(*operands):
    """The dot precision for a kernel's MXU operands: HIGHEST where one is float32, else the default.
    The MXU multiplies bf16: a float32 dot at the default precision rounds both operands to bf16 (a
    relative error of 2^-9 per product; on a v5e the f32 verify cases missed their 5e-6 tolerance
    by up to 1300x, and large logits came out wrong outright), HIGHEST takes the multi-pass fp32
    product. bf16 operands need nothing: their product is exact in the f32 accumulator."""
    import jax.numpy as jnp
    from jax import lax

    return lax.Precision.HIGHEST if any(o.dtype == jnp.float32 for o in operands) else None


def exact_weights_scratch(x_block, itemsize: int) -> int:
    """VMEM that `dot_by_exact_weights` takes for an x block of `itemsize`-byte elements: for f32,
    its three bf16 terms and two f32 remainders; nothing for bf16."""
    return 3 * block_bytes(x_block, 2) + 2 * block_bytes(x_block, 4) if itemsize == 4 else 0


def dot_by_exact_weights(x, w):
    """x [m, k] @ w [k, n] in f32, where every value of w is exact in bf16 (8-bit integer or e4m3
    weights): for float32 x, x split exactly into three bf16 terms (each the top 16 bits of what is
    left: x = hi + mid + lo) and three one-pass products summed in f32, smallest first. HIGHEST
    splits both operands and takes six products, three of them with w's lower terms, which are zero
    here: the same accuracy in half the MXU passes. bf16 x: its one exact product. The terms are cut
    with an integer mask, and w goes to bf16 through f32: libtpu's static profile aborts on a bf16
    unpack (bf16 -> f32, 8-bit -> bf16) in a kernel body."""
    import jax.numpy as jnp
    from jax import lax

    if w.dtype != jnp.bfloat16:
        w = w.astype(jnp.float32).astype(jnp.bfloat16)
    if x.dtype != jnp.float32:
        return jnp.dot(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    def top(v):  # v's sign, exponent and top 7 mantissa bits, exact in bf16
        return lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.int32) & -65536, jnp.float32)

    hi = top(x)
    rest = x - hi
    mid = top(rest)
    lo = rest - mid

    def one(part):
        return jnp.dot(part.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)

    return (one(lo) + one(mid)) + one(hi)
