"""The interface of a suggest detector, the match it returns, and the roofline arithmetic they share.

A `Detector` is one pattern a custom kernel replaces: its `name` (the `pattern` of the JSON
document), its `label` (the human name, kept in `results/suggest.py` where the renderers read it),
`find(flow)` (its matches in one module, each with typed `Shapes`), `bound(shapes, chip, backward)`
(the least seconds any kernel needs at those shapes), and the bundled kernel it maps to
(`kernel`, a name in `tpudiag/kernels/registry.py` that `kernels/at_shapes.py` builds at the
shapes) or why none fits (`no_kernel`). `Shapes` are small frozen models whose `to_dict()` is the
`shapes` object of a suggestion.

It walks no HLO itself (`walk.py` does) and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tpudiag.model import Model
from tpudiag.results.suggest import PATTERN_LABELS

# Bytes per element of a pattern's `dtype` in the bounds; 2 (bf16) for any other type.
STORED_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s8": 1, "u8": 1, "s32": 4}


def stored_bytes(dtype: str) -> int:
    return STORED_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class Shapes(Model):
    """What a kernel at a match's shapes needs; one subclass per pattern, its fields in document order."""


@dataclass(frozen=True)
class PatternMatch:
    detector: Detector
    module: str
    ops: tuple[str, ...]  # top-level instructions that execute it, in program order
    anchors: tuple[str, ...]  # the instructions that identify it
    source: tuple[str, ...]  # Python source lines of the anchors, most frequent first
    shapes: Shapes | None  # None only for a pattern XLA already replaced (nothing to price)
    notes: tuple[str, ...] = ()  # causal mask, f32 softmax, with residual add, ...
    replaced_by_xla: str | None = None  # XLA's own kernel already does it (no suggestion)
    # The instruction naming the data the pattern works on (a norm's row sum, RoPE's rotated tensor,
    # attention's scores): two matches with one `instance` are one instance (a forward and its
    # gradient matched apart); empty: the first anchor.
    instance: str = ""

    @property
    def pattern(self) -> str:
        return self.detector.name


class Detector:
    """One pattern. Subclasses set the class attributes and implement `find` and `bound`."""

    name: ClassVar[str]
    kernel: ClassVar[str | None] = None  # the bundled kernel (tpudiag/kernels/registry.py) that replaces it
    no_kernel: ClassVar[str] = ""  # why no bundled kernel fits, where `kernel` is None
    matmul_work: ClassVar[bool] = False  # its own work is matmuls: its ops include the matmul fusions

    @property
    def label(self) -> str:
        return PATTERN_LABELS[self.name]

    def find(self, flow) -> list[PatternMatch]:
        """Every match in `flow`'s module (a `walk.Flow`), in program order."""
        raise NotImplementedError

    def bound(self, shapes: Shapes, chip, backward: bool = False) -> float | None:
        """The least seconds the pattern needs on `chip` at `shapes`; None where the shapes do not say
        enough. `backward`: forward and backward."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<detector {self.name}>"


def roofline_s(nbytes: float, flops: float, chip, backward: bool) -> float:
    """The larger of `nbytes` at HBM bandwidth and `flops` at the bf16 peak; forward and backward is
    three times the forward's (a gradient reads and computes about twice what the forward does)."""
    return (3 if backward else 1) * max(nbytes / chip.hbm_bytes_per_s, flops / chip.peak_bf16_flops_per_s)
