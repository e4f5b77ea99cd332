"""Which computations of an HLO module execute as sequences of ops (entry, loop bodies, branches).

Reads a `parse.hlo.HloModule`; returns computation names. Shared by the compile report, the
fusion report and the diff. No I/O.
"""

from __future__ import annotations

from tpudiag.parse.hlo import HloModule

# Instructions whose called computations run as a sequence of ops of their own (bodies, branches).
# Reducers (`to_apply` of reduce, all-reduce, sort, scatter) run inside their caller instead.
RUNS_CALLEES = frozenset({"while", "conditional", "call", "async-start"})


def executed_computations(module: HloModule) -> list[str]:
    """The entry computation and every while body/condition, branch and call target reachable from it.

    Their instructions are what the TPU executes as units; control-flow instructions themselves
    are not rows (their cost is their bodies'), and a loop body is counted once: the trip count
    is unknown.
    """
    entry = module.entry
    if entry is None:
        return []
    order, todo = [], [entry.name]
    while todo:
        name = todo.pop(0)
        if name in order or name not in module.computations:
            continue
        if module.computations[name].execution_thread not in (None, "main"):
            # v6e SparseCore offload runs beside the TensorCore, asynchronously; XLA's own
            # non-fusion computation list (main thread) leaves it out too.
            continue
        order.append(name)
        for instr in module.computations[name].instructions:
            if instr.opcode in RUNS_CALLEES:
                todo += instr.called
    return order


