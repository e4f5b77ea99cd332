"""The registry of suggest detectors: the only list of the patterns `tpudiag suggest` looks for.

`DETECTORS` is an ordered tuple of detector instances (base.Detector); `find_patterns(module)` runs
each on one optimized HLO module and returns their matches in registry order, in program order
within a pattern. Adding a pattern is one module here and one line in `DETECTORS` (and its label in
`results/suggest.py`'s `PATTERN_LABELS`, where the renderers read it). No I/O.
"""

from __future__ import annotations

from tpudiag.analyze.suggest.detectors.act_quant import ACT_QUANT_MATMUL
from tpudiag.analyze.suggest.detectors.attention import DECODE, LATENT, PREFILL
from tpudiag.analyze.suggest.detectors.base import Detector, PatternMatch
from tpudiag.analyze.suggest.detectors.cross_entropy import CROSS_ENTROPY
from tpudiag.analyze.suggest.detectors.dequant import DEQUANT_MATMUL
from tpudiag.analyze.suggest.detectors.moe import MOE
from tpudiag.analyze.suggest.detectors.norms import LAYERNORM, RMSNORM
from tpudiag.analyze.suggest.detectors.rope import ROPE
from tpudiag.analyze.suggest.detectors.sampling import SAMPLING
from tpudiag.analyze.suggest.detectors.walk import Flow
from tpudiag.parse.hlo import HloModule

DETECTORS: tuple[Detector, ...] = (
    PREFILL,
    DECODE,
    LATENT,
    RMSNORM,
    LAYERNORM,
    CROSS_ENTROPY,
    ROPE,
    SAMPLING,
    MOE,
    DEQUANT_MATMUL,
    ACT_QUANT_MATMUL,
)
BY_NAME: dict[str, Detector] = {d.name: d for d in DETECTORS}


def find_patterns(module: HloModule, detectors: tuple[Detector, ...] = DETECTORS) -> list[PatternMatch]:
    """Every match of `detectors` in `module`, in their order, in program order within a pattern."""
    flow = Flow(module)
    return [m for d in detectors for m in d.find(flow)]
