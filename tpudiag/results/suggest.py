"""The `tpudiag.suggest/1` result as frozen models (docs/suggest.md has every field). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpudiag.model import Model

SCHEMA = "tpudiag.suggest/1"

# The human name of each pattern a suggest detector finds (analyze/suggest/detectors/), by its
# `pattern` in the document: the renderers read it here, where report/ may import it, and each
# detector's `label` is its entry.
PATTERN_LABELS: dict[str, str] = {
    "attention": "attention (prefill)",
    "attention_decode": "attention (decode, KV cache)",
    "latent_attention": "latent attention (MLA, projections not absorbed)",
    "rmsnorm": "RMSNorm",
    "layernorm": "LayerNorm",
    "cross_entropy": "softmax cross-entropy",
    "rope": "rotary embedding",
    "sampling": "top-k / top-p sampling",
    "moe": "MoE dispatch",
    "dequant_matmul": "dequantize-then-matmul",
    "w8a8_matmul": "activation-quantized matmul (w8a8, int8 or e4m3)",
}


def pattern_label(pattern: str) -> str:
    """The human name of `pattern`; the name itself for one this tpudiag does not know (a newer run's)."""
    return PATTERN_LABELS.get(pattern, pattern)


@dataclass(frozen=True)
class ChipMeasure(Model):
    """`suggest --measure`: the suggestion's kernel, and XLA's side, timed on the attached TPU at the
    program's matched shapes (device time from the trace, the fastest of `calls` calls); like the
    estimate beside it, every run of the pattern in one execution of the module."""

    device: str  # the TPU's kind, as JAX names it
    calls: int  # timed calls per variant
    kernel_basis: str  # "measured_on_chip": the kernel itself timed here
    xla_basis: str  # "measured_run": the run's own ops in its trace; "measured_on_chip": the XLA twin timed here
    kernel_s: float | None  # None where the kernel failed on the chip (`error`)
    xla_s: float | None  # per xla_basis
    xla_twin_s: float | None  # the kernel's plain-JAX twin at the same shapes, timed here (also beside a run's own)
    speedup: float | None  # xla_s / kernel_s
    saved_s: float | None  # xla_s - kernel_s
    shape: str  # the shapes the kernel was timed at, as it sees them
    error: str | None = field(default=None, metadata={"omit_none": True})  # why a variant has no time


@dataclass(frozen=True)
class Suggestion(Model):
    """One pattern in one module, and what replacing it with a kernel would gain."""

    pattern: str
    kernel: str | None  # the bundled kernel to use; None where none fits (then `kernel_s` is a roofline bound)
    module: str
    ops: tuple[str, ...]  # the XLA ops it replaces (top-level instructions)
    source: tuple[str, ...]  # Python source lines, most frequent first
    shapes: dict  # the match's shapes (one object per pattern: docs/suggest.md lists their keys)
    share: float  # xla_s over the module's estimated TPU time
    xla_s: float  # the estimated TPU time of exactly those ops, every run in one execution of the module
    kernel_s: float | None  # the kernel compiled at these shapes on the same target (or the pattern's roofline bound), times runs
    kernel_basis: str  # "measured_table" | "compiled" | "roofline_bound" | "none"
    expected_speedup: float | None
    saved_s: float | None  # per execution of the module (every run of the pattern in it)
    confidence: str  # high | medium | low
    reason: str  # what the estimate rests on, and what it leaves out
    snippet: str | None
    notes: tuple[str, ...]
    shown: bool  # False: below the minimum share or speedup (listed with --all)
    backward: bool  # the XLA ops include the gradient, and the kernel was priced forward and backward
    measured_share: float | None = field(default=None, metadata={"omit_none": True})  # of measured op time
    runs: int = 1  # runs of the pattern per execution of the module (the trip counts of the loops around it)
    # From a profile run: the module's executions per traced step, and saved_s times them.
    executions_per_step: float | None = field(default=None, metadata={"omit_none": True})
    saved_per_step_s: float | None = field(default=None, metadata={"omit_none": True})
    # True where xla_s and share are measured on a TPU (a profile run made on one), not estimated.
    xla_measured: bool | None = field(default=None, metadata={"omit_none": True})
    # "measured_table": xla_s is the chip's measured XLA time at the kernel's bench shape, scaled
    # here by the kernel's roofline floor (kernel_basis "measured_table" says the same of kernel_s).
    xla_basis: str | None = field(default=None, metadata={"omit_none": True})
    # `suggest --measure`: timed on the attached TPU at these shapes (None where not measured: no
    # bundled kernel fits, or below the minimum share without --all).
    measured: ChipMeasure | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class Replaced(Model):
    """A pattern XLA already replaced with its own kernel: nothing to suggest."""

    pattern: str
    module: str
    by: str
    ops: tuple[str, ...]
    source: tuple[str, ...]
    notes: tuple[str, ...] = ()  # what XLA's kernel covers, and what it leaves outside


@dataclass(frozen=True)
class Finding(Model):
    """A static finding from the TPU layouts and the fusion report, with its cost."""

    kind: str  # padding | f32_matmul | relayout_before_matmul | fusion_break
    module: str
    op: str
    source: str | None
    bytes: int
    estimated_s: float  # the bytes at the chip's HBM bandwidth
    detail: str


@dataclass(frozen=True)
class SuggestReport(Model):
    SCHEMA = SCHEMA

    schema: str
    run_dir: str
    target: str
    chip: str
    suggestions: tuple[Suggestion, ...]  # ranked by saved_s, then share
    replaced: tuple[Replaced, ...]
    findings: tuple[Finding, ...]
    hidden: int  # suggestions below the minimums (in `suggestions` with shown=False)
    notes: tuple[str, ...]
