"""The time a compiled step's asynchronous copies within the chip (HBM to VMEM prefetches and their
evictions: copy-start/copy-done, neither side in host memory) add to it.

A copy runs beside the ops the schedule puts between its start and its done. It shares HBM with the
HBM-bound ones, so only the compute there hides it; what that compute does not cover, the done waits
for. Copies whose windows overlap in one computation share HBM: a group of them takes all their
bytes' time against the compute in the group's window. Each group counts once per run of its
computation (loop trip counts). On a v5e, the copy-done waits of three llama_train steps took 0.36,
0.98 and 2.78 ms a step (`tpudiag report fixtures/tpu-v5e/llama_train`, `llama_train_d128`,
`llama_train_s8192`); this model, on the estimate's own compile of each, 0.34, 0.25 and 1.74 ms.

Transfers to or from host memory are `host_transfers.py`'s. Pure: takes the parsed module, its loop
runs and the op rows' times; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.compile.host_transfers import computation_totals, crossing, overlapping, window_time


@dataclass(frozen=True)
class CopyTime:
    """A step's asynchronous copies within the chip: their HBM time and the part no compute hides."""

    copy_s: float  # every copy's own time (its op row's), x runs
    exposed_s: float  # what the compute between starts and dones does not cover, x runs


def copy_time(module, runs: dict[str, int], ops) -> CopyTime | None:
    """The copies' time, or None when the step makes none. `ops`: (name, computation, estimated
    seconds of one run, runs, bound_by, opcode) of the op rows, collectives left out."""
    copies = {name: s for name, _, s, _, _, opcode in ops if opcode == "copy-start"}
    compute = {name: s for name, _, s, _, bound, opcode in ops if bound != "hbm" and opcode not in ("copy-start",
                                                                                                    "copy-done")}
    comp_total = computation_totals((name, comp, s, n) for name, comp, s, n, _, _ in ops if name in compute)
    total = exposed = 0.0
    for c in module.executed_computations:
        instrs = module.computations[c].instructions
        names = [i.name for i in instrs]
        dones = {d.operands[0]: d.name for d in instrs if d.operands and d.opcode == "copy-done"}
        pairs = [(i.name, dones.get(i.name), copies[i.name]) for i in instrs
                 if i.opcode == "copy-start" and i.name in copies and crossing(module, i) is None]
        n = runs.get(c, 1)
        for lo, hi, members in overlapping(names, pairs):
            need = sum(members)
            total += need * n
            exposed += max(0.0, need - window_time(module, c, names, lo, hi, compute, comp_total, n)) * n
    return CopyTime(copy_s=total, exposed_s=exposed) if total else None
