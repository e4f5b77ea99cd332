"""The bundled kernels' device times measured on a TPU chip, at each kernel's bench shape.

One table per chip (`measured_v5e.json`, written by bench/chip_measured.py from a `kernels bench
--on-chip` run): per kernel, our fastest call, XLA's (and JAX's kernel's where it ships one) and
the roofline floor at the bench shape; an entry `NAME@PATH` is one path inside a kernel that its
bench does not take (sampling's top-p without a top-k), measured at a program's shapes and named
by `AtShapes.measured_as`. `chip_figures(chip)` gives {entry: ChipFigure}; a chip
without a table gives {}. `suggest` scales these to a program's shapes (`ChipFigure.efficiency`:
the share of its floor the kernel reached; `xla_over_floor`: XLA's time in floors). No jax.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
TABLES = {"v5e": _HERE / "measured_v5e.json"}


@dataclass(frozen=True)
class ChipFigure:
    kernel: str
    kernel_us: float  # our fastest call
    floor_us: float  # the bench shape's roofline floor
    xla_us: float | None  # XLA's fastest call, where the bench has an XLA variant
    device: str
    command: str
    # The measured call's grid steps in whole blocks over its rows (`AtShapes.step_scale` at the
    # shape it was measured at): 1 at a bench shape of whole blocks.
    step_scale: float = 1.0

    @property
    def efficiency(self) -> float:
        """The share of its roofline floor the kernel reached on the chip."""
        return self.floor_us / self.kernel_us

    def seconds_at(self, floor_s: float, step_scale: float = 1.0) -> float:
        """The kernel's time at shapes whose floor is `floor_s` and whose grid steps are
        `step_scale` whole blocks over their rows: the share of the whole-block floor it reached."""
        return floor_s * step_scale / (self.efficiency * self.step_scale)

    @property
    def xla_over_floor(self) -> float | None:
        return None if self.xla_us is None else self.xla_us / self.floor_us


def raw_table(chip: str) -> dict:
    """The table's kernels as stored ({} for a chip without one)."""
    path = TABLES.get(chip)
    return json.loads(path.read_text())["kernels"] if path is not None and path.is_file() else {}


def chip_figures(chip: str) -> dict[str, ChipFigure]:
    """{kernel: ChipFigure} for the kernels of `chip`'s table that have a time and a floor."""
    out = {}
    for name, k in raw_table(chip).items():
        mine, floor = k.get("kernel"), k.get("floor_us")
        if not mine or not floor:
            continue
        m = k.get("measured", {})
        out[name] = ChipFigure(kernel=name, kernel_us=mine["min_us"], floor_us=floor,
                               xla_us=(k.get("xla") or {}).get("min_us"), device=m.get("device", "?"),
                               command=m.get("command", "?"), step_scale=k.get("step_scale", 1.0))
    return out
