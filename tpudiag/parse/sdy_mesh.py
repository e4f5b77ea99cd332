"""The device mesh a jitted computation was written against, from its StableHLO text: Shardy's
`sdy.mesh @mesh = <["data"=8, "model"=4], device_ids=[...]>` (jax >= 0.10 lowers with Shardy).

Returns a `DeviceMesh` (axis names and sizes in order, and the device order when it is not
iota). The TPU compiler's optimized HLO no longer has the user's axis names; this is where
`compile` learns which mesh axes a collective spans. No analysis here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

_MESH = re.compile(r"sdy\.mesh\s+@[\w.$-]+\s*=\s*<\s*\[(?P<axes>[^\]]*)\](?:\s*,\s*device_ids\s*=\s*\[(?P<ids>[^\]]*)\])?")
_AXIS = re.compile(r'"(?P<name>[^"]+)"\s*=\s*(?P<size>\d+)')


@dataclass(frozen=True)
class DeviceMesh:
    axes: tuple[tuple[str, int], ...]  # (name, size), major to minor
    device_ids: tuple[int, ...] | None  # the mesh's devices in row-major order; None: 0..n-1

    @property
    def devices(self) -> int:
        return prod(size for _, size in self.axes)


def read_mesh(text: str) -> DeviceMesh | None:
    """The largest mesh the module declares (a module may also declare an empty or one-device
    mesh for replicated values); None without one."""
    best = None
    for m in _MESH.finditer(text):
        axes = tuple((a["name"], int(a["size"])) for a in _AXIS.finditer(m["axes"]))
        if not axes:
            continue
        ids = tuple(int(x) for x in m["ids"].split(",") if x.strip()) if m["ids"] else None
        mesh = DeviceMesh(axes, ids)
        if best is None or mesh.devices > best.devices:
            best = mesh
    return best
