"""Bytes an op moves outside HBM: XLA's memory-space assignment places some buffers in VMEM (`S(1)`
in a TPU layout: a prefetched weight, a prefetch's destination, a small activation). An op's bytes
accessed (analyze/hlo/cost.py, as XLA counts them) include those; its HBM time must not.

Used by `tpudiag estimate`, whose step is HBM-bound where it decodes: a 70B decode step on v6e has
its weights prefetched into VMEM layer by layer (a `copy-start` or `slice` reads HBM, writes VMEM; the
matmul then reads VMEM), and counting every byte at HBM bandwidth counts the weights twice.
Pure: takes the parsed module and an instruction.
"""

from __future__ import annotations


def outside_hbm_bytes(instr, whole: bool = False) -> int:
    """Bytes of `instr`'s result in a memory space other than HBM; with `whole`, only where the
    result is a single array (a tuple counts 0: the live ranges list its elements apart)."""
    if instr is None or "S(" not in (instr.shape or ""):  # the common case: nothing outside HBM
        return 0
    try:
        shape = instr.parsed_shape
    except ValueError:
        return 0
    leaves = shape.leaves()
    if whole and len(leaves) != 1:
        return 0
    return sum(leaf.bytes for leaf in leaves if leaf.memory_space)


def vmem_bytes(module, instr) -> int:
    """Bytes of `instr`'s operands and results in a memory space other than HBM, each operand once.
    A `copy-start`'s result is (destination, source, context): the source is its operand again, so
    only the destination counts as its result (a copy from VMEM to HBM writes HBM in full)."""
    operands = sum(outside_hbm_bytes(module.operand(instr, k)) for k in range(len(instr.operands)))
    if instr.opcode == "copy-start":
        try:
            shape = instr.parsed_shape
        except ValueError:
            return operands
        leaves = shape.tuple_shapes if shape.is_tuple else ()
        dest = leaves[0] if leaves else None
        return operands + (dest.bytes if dest is not None and dest.is_array and dest.memory_space else 0)
    return operands + outside_hbm_bytes(instr)


def hbm_padding(module, instr) -> float:
    """How much more an op moves in HBM than its logical bytes say: the tiled bytes (`Shape.tiled_bytes`)
    of its HBM operands and results over their logical bytes, 1.0 where nothing is padded or a shape
    cannot be read. A TPU layout pads the two most minor dims to its tile (8 x 128): an array whose
    minor dim is 32 or 64 (a rotary half, a 64-wide head) moves 4x or 2x its bytes."""
    shapes = [module.operand(instr, k) for k in range(len(instr.operands))] + [instr]
    logical = tiled = 0
    for i in shapes:
        if i is None:
            continue
        try:
            leaves = i.parsed_shape.leaves()
        except ValueError:
            return 1.0
        for leaf in leaves:
            if leaf.is_array and not leaf.memory_space:
                logical += leaf.bytes
                tiled += leaf.tiled_bytes
    return tiled / logical if logical and tiled > logical else 1.0
