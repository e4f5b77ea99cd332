"""Every collective of a module compiled for a TPU slice: what it moves, between which devices,
which of the program's mesh axes it spans, how many ICI hops its ring crosses on that topology,
its modelled time, and whether the schedule hides it behind compute.

docs/compile.md#collectives-on-a-slice has the model. Pure: takes the parsed HLO, the op rows,
the worker's result (device coordinates) and the program's mesh; no I/O.
"""

from __future__ import annotations

import math
import re

import numpy as np

from tpudiag.analyze.hlo.collectives import collective_instruction, describe
from tpudiag.analyze.hlo.vocabulary import COLLECTIVE_DONE, COLLECTIVE_START
from tpudiag.parse.hlo_model import HloModule
from tpudiag.parse.hlo_text import ReplicaGroups
from tpudiag.parse.sdy_mesh import DeviceMesh
from tpudiag.results.compile import CollectiveEstimate
from tpudiag.targets import Target, topology_dims, wraparound

def groups_of(groups: ReplicaGroups | None, devices: int) -> list[tuple[int, ...]]:
    """The device ids of each replica group, whichever way the HLO spelled them (none or an empty
    list: every device in one group)."""
    if groups is None or (groups.groups is not None and not groups.groups):
        return [tuple(range(devices))]
    if groups.groups is not None:
        return [tuple(g) for g in groups.groups]
    if groups.mesh:
        names = [a for a, _ in groups.mesh]
        sizes = [s for _, s in groups.mesh]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        listed = [names.index(a) for a in groups.axes if a in names] or list(range(len(names)))
        order = [k for k in range(len(names)) if k not in listed] + listed
        flat = ids.transpose(order).reshape(-1, math.prod(sizes[k] for k in listed))
        return [tuple(int(x) for x in row) for row in flat]
    return [tuple(range(devices))]


def mesh_axes(group: tuple[int, ...], mesh: DeviceMesh | None) -> tuple[str, ...] | None:
    """The program's mesh axes along which the devices of `group` differ (device d sits at mesh
    position d, or where the mesh's device_ids put it); None without a mesh that covers them."""
    if mesh is None or len(group) < 1 or max(group) >= mesh.devices:
        return None
    where = {d: i for i, d in enumerate(mesh.device_ids)} if mesh.device_ids else None
    sizes = [s for _, s in mesh.axes]
    coords = np.array([np.unravel_index(where[d] if where else d, sizes) for d in group])
    return tuple(name for k, (name, _) in enumerate(mesh.axes) if len(set(coords[:, k].tolist())) > 1)


def wraps(target: Target) -> tuple[bool, ...] | None:
    """Which axes of the slice have wraparound links (`targets.wraparound`)."""
    dims = topology_dims(target.topology)
    return None if dims is None else wraparound(target.chip, dims)


def group_hops(group: tuple[int, ...], coords: list[list[int]] | None, dims, wrap) -> int | None:
    """The group's diameter on the slice: the most ICI hops between two of its devices (shortest
    way round on an axis with wraparound links). 1: neighbours only; a group spread over the whole
    slice crosses its full diameter."""
    if not coords or dims is None or wrap is None or len(group) < 2 or max(group) >= len(coords):
        return None if len(group) >= 2 else 0
    pts = np.array([coords[d][:len(dims)] for d in group])
    diff = np.abs(pts[:, None, :] - pts[None, :, :])
    size = np.array(dims[:pts.shape[1]])
    ring = np.array(wrap[:pts.shape[1]])
    diff = np.where(ring, np.minimum(diff, size - diff), diff)
    return int(diff.sum(axis=-1).max())


# libtpu's async collective fusion (--xla_tpu_enable_async_collective_fusion, v5e): the collective
# is split into `async-collective-start`, continuation fusions that carry its state through the
# compute, and `async-collective-done`, kCustom fusions paired by their name's suffix.
_TPU_ASYNC = re.compile(r"async-collective-(start|done)(\.\d+)?$")
# XLA's async collectives: a collective's own -start/-done opcodes, or the generic async wrapper.
_STARTS = COLLECTIVE_START | {"async-start"}
_DONES = COLLECTIVE_DONE | {"async-done"}


def async_collective_tails(module: HloModule) -> set[str]:
    """The continuation fusions and the done of every `async-collective-start` (the ops between
    start and done that consume its state, through get-tuple-elements): they carry the same
    collective, which is counted once, at its start."""
    tails: set[str] = set()
    for comp in module.computations.values():
        names = [i.name for i in comp.instructions]
        for k, instr in enumerate(comp.instructions):
            m = _TPU_ASYNC.match(instr.name)
            if not m or m.group(1) != "start":
                continue
            done = f"async-collective-done{m.group(2) or ''}"
            if done not in names:
                continue
            own = _signature(module, instr)
            family = {instr.name}
            for later in comp.instructions[k + 1:names.index(done) + 1]:
                if any(o in family for o in later.operands):
                    family.add(later.name)
                    # A fusion fed by the family is one of its steps only if it holds the same
                    # collective; others merely use a value a continuation computed on the way.
                    if later.opcode == "fusion" and own is not None and _signature(module, later) == own:
                        tails.add(later.name)
    return tails


def _signature(module: HloModule, instr) -> tuple | None:
    """(opcode, channel, groups, shape) of the collective an instruction holds: what makes a
    continuation fusion the same collective as its start."""
    inner = collective_instruction(module, instr)
    if inner is None:
        return None
    return (inner.opcode, inner.attributes.get("channel_id"), inner.attributes.get("replica_groups"),
            inner.parsed_shape.dims if hasattr(inner.parsed_shape, "dims") else inner.shape.split("{")[0])


def _async_pair(module: HloModule, instr) -> tuple[str, str] | None:
    """(start, done) names of the asynchronous collective `instr` is part of; None when synchronous."""
    comp = module.computations.get(instr.computation)
    if comp is None:
        return None
    m = _TPU_ASYNC.match(instr.name)
    if m:
        start, done = (f"async-collective-{end}{m.group(2) or ''}" for end in ("start", "done"))
        found = all(module.instruction(n, instr.computation) is not None for n in (start, done))
        return (start, done) if found else None
    if instr.opcode in _STARTS:
        done = next((i for i in comp.instructions if i.operands and i.operands[0] == instr.name
                     and i.opcode in _DONES), None)
        return (instr.name, done.name) if done is not None else None
    if instr.opcode in _DONES and instr.operands:
        return instr.operands[0], instr.name
    return None


def _scheduled_between(module: HloModule, instr, times: dict[str, float], comm: set[str]) -> tuple[bool, float]:
    """(async, estimated time of the other ops the schedule places between its start and done).
    The optimized HLO of a TPU module is scheduled: a computation's instructions print in order."""
    pair = _async_pair(module, instr)
    if pair is None:
        return False, 0.0
    names = [i.name for i in module.computations[instr.computation].instructions]
    if pair[0] not in names or pair[1] not in names:
        return True, 0.0
    lo, hi = names.index(pair[0]), names.index(pair[1])
    return True, sum(times.get(n, 0.0) for n in names[lo + 1:hi] if n not in comm)


def collective_estimates(module: HloModule, rows: list[dict], target: Target, mesh: DeviceMesh | None,
                         device_coords: list[list[int]] | None, devices: int) -> list[CollectiveEstimate]:
    """One `CollectiveEstimate` per collective op row (`rows`: the module's op rows, `modelled`
    for collectives), the most exposed time (x runs) first."""
    times = {r["name"]: r["estimated_s"] for r in rows}
    comm = {r["name"] for r in rows if r["modelled"]}
    dims, wrap = topology_dims(target.topology), wraps(target)
    out = []
    for r in rows:
        if not r["modelled"]:
            continue
        instr = module.instruction(r["name"])
        op = describe(module, r["name"])
        inner = collective_instruction(module, instr) if instr is not None else None
        if instr is None or op is None or inner is None:
            continue
        groups = groups_of(inner.replica_groups, devices)
        is_async, between = _scheduled_between(module, instr, times, comm)
        hops = [group_hops(g, device_coords, dims, wrap) for g in groups]
        out.append(CollectiveEstimate(
            name=r["name"], kind=op.kind, source=r["source"], message_bytes=int(op.message_bytes or 0),
            ici_bytes=int(r["ici_bytes"]), replica_groups=op.replica_groups, group_size=len(groups[0]),
            groups=len(groups), mesh_axes=mesh_axes(groups[0], mesh),
            ici_hops=max(h for h in hops) if hops and all(h is not None for h in hops) else None,
            estimated_s=r["estimated_s"], runs=r["runs"], is_async=is_async, scheduled_between_s=between,
            exposed_s=max(0.0, r["estimated_s"] - between) if is_async else r["estimated_s"]))
    out.sort(key=lambda c: (-c.exposed_s * c.runs, -c.estimated_s * c.runs, c.name))  # the costliest first
    return out
