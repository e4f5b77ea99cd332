"""Bytes an op moves outside HBM: XLA's memory-space assignment places some buffers in VMEM (`S(1)`
in a TPU layout: a prefetched weight, a prefetch's destination, a small activation). An op's bytes
accessed (analyze/hlo/cost.py, as XLA counts them) include those; its HBM time must not.

Used by `tpudiag estimate`, whose step is HBM-bound where it decodes: a 70B decode step on v6e has
its weights prefetched into VMEM layer by layer (a `copy-start` or `slice` reads HBM, writes VMEM; the
matmul then reads VMEM), and counting every byte at HBM bandwidth counts the weights twice.
Pure: takes the parsed module and an instruction.
"""

from __future__ import annotations


def _outside_hbm(instr) -> int:
    if instr is None or "S(" not in (instr.shape or ""):  # the common case: nothing outside HBM
        return 0
    try:
        shape = instr.parsed_shape
    except ValueError:
        return 0
    return sum(leaf.bytes for leaf in shape.leaves() if leaf.memory_space)


def vmem_bytes(module, instr) -> int:
    """Bytes of `instr`'s operands and results in a memory space other than HBM, each operand once."""
    return (sum(_outside_hbm(module.operand(instr, k)) for k in range(len(instr.operands)))
            + _outside_hbm(instr))
