"""Transfers between HBM and host memory in a compiled step (activation offload), and the time they
add to it.

XLA's host-offload passes write an offloaded activation into a pinned-host buffer (`S(5)` in a TPU
layout) with an asynchronous dynamic-update-slice or copy, and read it back with an asynchronous
dynamic-slice or copy: a start and a done in the scheduled computation, the ops between them free to
run. The model (docs/estimate.md#activation-offload-host-transfers):

- the link between a chip and its host carries each direction at the chip table's
  `host_link_bytes_per_s` (full duplex), shared by the chip's devices;
- transfers whose start..done windows overlap in one computation share the link: a group of them
  takes the longer direction's bytes over it;
- what the compute scheduled inside the group's window does not cover is exposed, once per run of
  the computation (loop trip counts). A start without a done is exposed whole.

A transfer moves bytes across the link only where exactly one side is in host memory: a slice written
into a host buffer from HBM, a slice read out of one into HBM, a copy between the two (a copy into
host memory followed by a slice write of that copy into a host buffer crosses once). Left out: the
link's latency and DMA setup, and the link time of transfers inside a loop or call that sits in
another transfer's window (each is hidden by its own window's compute only).

Pure: takes the parsed module, its loop runs and the op rows' times; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.vocabulary import CONTROL_FLOW, HOST_TRANSFER_STARTS

HOST = 5  # S(5): pinned host memory


@dataclass(frozen=True)
class Transfer:
    computation: str
    start: str
    done: str | None  # None when the computation has no done for it
    to_host: bool
    bytes: int  # one run's
    runs: int


@dataclass(frozen=True)
class HostTime:
    """A step's host transfers, per device: their link time and the part compute hides (their bytes:
    `offload_bytes`)."""

    link_s: float  # every group's time on the link (its longer direction), x runs
    exposed_s: float  # what the compute between starts and dones does not cover, x runs

    @property
    def hidden_s(self) -> float:
        return self.link_s - self.exposed_s


def _on_host(shape) -> bool:
    return any(leaf.memory_space == HOST for leaf in shape.leaves())


def crossing(module, i) -> tuple[bool, int] | None:
    """(to host, bytes) of one async start that crosses the host link, or None: one that moves nothing
    between HBM and host memory, or moves it within one of them."""
    if i.opcode not in HOST_TRANSFER_STARTS or not i.operands:
        return None
    try:
        src_host = _on_host(module.operand(i, 0).parsed_shape)
        shape = i.parsed_shape
    except (ValueError, AttributeError):
        return None
    parts = shape.tuple_shapes if shape.is_tuple else ()
    if i.opcode == "dynamic-update-slice-start" and src_host and len(i.operands) > 1:
        update = module.operand(i, 1).parsed_shape  # written into the host buffer
        return None if _on_host(update) else (True, update.bytes)
    if i.opcode == "dynamic-slice-start" and src_host and len(parts) > 1:
        return None if _on_host(parts[1]) else (False, parts[1].bytes)  # ((operand, indices...), slice, context)
    if i.opcode == "copy-start":
        out = shape.leaves()
        if out and src_host != (out[0].memory_space == HOST):
            return (not src_host), out[0].bytes
    return None


def host_transfers(module, runs: dict[str, int]) -> list[Transfer]:
    """Every asynchronous transfer between HBM and host memory in the computations the step runs, in
    schedule order."""
    out = []
    for c in module.executed_computations:
        instrs = module.computations[c].instructions
        dones = {d.operands[0]: d.name for d in instrs if d.operands and d.opcode.endswith("-done")}
        for i in instrs:
            got = crossing(module, i)
            if got is not None:
                out.append(Transfer(computation=c, start=i.name, done=dones.get(i.name), to_host=got[0],
                                    bytes=got[1], runs=runs.get(c, 1)))
    return out


def offload_bytes(transfers: list[Transfer]) -> tuple[int, int]:
    """(bytes written to host memory, bytes read back) per step."""
    return (sum(t.bytes * t.runs for t in transfers if t.to_host),
            sum(t.bytes * t.runs for t in transfers if not t.to_host))


def computation_totals(rows) -> dict[str, float]:
    """Seconds per computation over all its runs, from (name, computation, seconds of one run, runs)
    op rows: what `window_time` counts for a loop, branch or call in a window."""
    out: dict[str, float] = {}
    for _, comp, s, n in rows:
        out[comp] = out.get(comp, 0.0) + s * n
    return out


def overlapping(names: list[str], pairs) -> list[tuple[int, int, list]]:
    """(start name, done name or None, item) pairs of one computation whose instructions are `names`
    in schedule order, merged where their windows overlap: (first start's position, last done's
    position, the items), in schedule order. A done not in the computation ends at its start."""
    index = {n: k for k, n in enumerate(names)}
    spans = [(index[start], index.get(done, index[start]), item) for start, done, item in pairs]
    groups: list[list] = []
    for lo, hi, item in sorted(spans, key=lambda x: (x[0], x[1])):
        if groups and lo < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], hi)
            groups[-1][2].append(item)
        else:
            groups.append([lo, hi, [item]])
    return [(lo, hi, items) for lo, hi, items in groups]


def window_time(module, comp: str, names: list[str], lo: int, hi: int, times: dict[str, float],
                comp_total: dict[str, float], runs: int) -> float:
    """Estimated seconds of the ops scheduled strictly between positions lo and hi of one run of a
    computation: each op's own time, and for a loop, branch or call its computations' whole time
    (every run of theirs, over the `runs` of this one)."""
    total = 0.0
    for n in names[lo + 1:hi]:
        total += times.get(n, 0.0)
        instr = module.instruction(n, comp)
        if instr is not None and instr.opcode in CONTROL_FLOW and instr.called:
            inner = {i.computation for i in module.walk(instr.called, into=CONTROL_FLOW)}
            total += sum(comp_total.get(c, 0.0) for c in inner) / max(runs, 1)
    return total


def host_time(module, transfers: list[Transfer], ops, bytes_per_s: float) -> HostTime:
    """The transfers' link time and exposed time on a link of `bytes_per_s` each way (per device).
    `ops`: (name, computation, estimated seconds of one run, runs) of the op rows that take compute
    or HBM time (collectives left out, as the collective model leaves them out of its windows)."""
    times = {name: s for name, _, s, _ in ops}
    comp_total = computation_totals(ops)
    by_comp: dict[str, list[Transfer]] = {}
    for t in transfers:
        by_comp.setdefault(t.computation, []).append(t)
    link = exposed = 0.0
    for comp, ts in by_comp.items():
        names = [i.name for i in module.computations[comp].instructions]
        for lo, hi, members in overlapping(names, [(t.start, t.done, t) for t in ts]):
            need = max(sum(t.bytes for t in members if t.to_host),
                       sum(t.bytes for t in members if not t.to_host)) / bytes_per_s
            n = members[0].runs
            between = window_time(module, comp, names, lo, hi, times, comp_total, n)
            link += need * n
            exposed += max(0.0, need - between) * n
    return HostTime(link_s=link, exposed_s=exposed)
