"""What every bundled kernel module declares: its `SPEC`, the verify cases and the bench setup.

Each kernel family lives in its own module under `tpudiag/kernels/` and exports one `SPEC`
(a `KernelSpec`, or a tuple of them when one module holds forward kernels for several ops).
`tpudiag/kernels/registry.py` lists the modules; `verify.py` and `bench.py` only read these
dataclasses, so a kernel module never imports them.

This module imports nothing heavy: it is read by the CLI before jax loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Tolerance:
    """Allowed |got - want| <= atol + rtol * |want|, elementwise, with the reason for the figure."""

    atol: float
    rtol: float
    reason: str

    def __post_init__(self):
        if self.atol < 0 or self.rtol < 0:
            raise ValueError("tolerances are non-negative")

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "reason": self.reason}


@dataclass(frozen=True)
class Case:
    """One verify case: fresh random inputs at one shape, one dtype, one set of static parameters.

    `make_args(key)` returns the positional arguments (jax arrays; floats random and never all zero;
    integer arguments such as page tables, lengths or group sizes as the case needs them).
    `params` are static keyword arguments passed alike to the kernel and the reference, except
    `block_sizes` (and anything in `kernel_params`), which only the kernel gets.
    `dtype` picks the tolerance ("float32" or "bfloat16"). `grad` also checks gradients of
    sum(out * random cotangent) with respect to `grad_argnums` against `jax.grad` of the reference.
    `exact`: integer outputs (sampled token ids) must match exactly.
    """

    label: str
    make_args: Callable[[Any], tuple]
    params: dict = field(default_factory=dict)
    dtype: str = "float32"
    grad: bool = False
    grad_argnums: tuple[int, ...] = (0,)
    exact: bool = False
    kernel_params: dict = field(default_factory=dict)
    # The spec's tolerance key where it is not `dtype`: a case that does deliberately less (a
    # quantizer's rounding ties) names the tolerance that says so.
    tolerance: str | None = None

    @property
    def tolerance_key(self) -> str:
        return self.tolerance or self.dtype

    def reference_params(self) -> dict:
        return {k: v for k, v in self.params.items() if k not in KERNEL_ONLY_PARAMS}

    def all_kernel_params(self) -> dict:
        return {**self.params, **self.kernel_params}


KERNEL_ONLY_PARAMS = ("block_sizes",)  # block sizes tune the kernel; the reference has none


@dataclass(frozen=True)
class BenchSetup:
    """What `tpudiag kernels bench` compiles for a TPU target at a production shape.

    `args` are `jax.ShapeDtypeStruct`s. `kernel`, `xla` and `jax_kernel` take them positionally;
    each is lowered for TPU and compiled in its own worker process. `kernel` is the Pallas kernel at
    the chosen block sizes with interpret=False; `xla` is the plain-JAX computation (what XLA does
    without a custom kernel); `jax_kernel` is JAX's own Pallas kernel for the same op, where JAX ships one.
    """

    shape: str
    args: tuple
    kernel: Callable
    xla: Callable
    jax_kernel: Callable | None = None
    jax_name: str | None = None
    blocks: str | None = None  # the block sizes used, as text ("block_q=512, block_k=512")
    # A variant's own arguments where its data layout differs from `args` ("kernel", "xla" or
    # "jax" -> ShapeDtypeStructs): JAX's kernel with K and V in one pool, say.
    variant_args: dict = field(default_factory=dict)
    # Arguments a variant writes in place ("kernel", "xla" or "jax" -> argnums), donated as a serving
    # engine donates its KV cache: without donation XLA copies an aliased buffer whole first.
    donate: dict = field(default_factory=dict)

    def args_for(self, variant: str) -> tuple:
        """The arguments `variant` ("kernel", "xla" or "jax") is lowered at."""
        return self.variant_args.get(variant, self.args)


def at_shape(prod: dict, shape: dict | None) -> dict:
    """A kernel's production shape `prod` with the fields of `shape` replaced: its bench setup at
    another real model's shape (`bench(shape={"seqs": 256, ...})`, bench/sweep_serving.py). A field
    `prod` does not have is a ValueError naming it and the fields there are."""
    unknown = sorted(set(shape or ()) - set(prod))
    if unknown:
        raise ValueError(f"unknown shape field(s) {', '.join(unknown)}; this kernel's are {', '.join(prod)}")
    return {**prod, **(shape or {})}


@dataclass(frozen=True)
class KernelSpec:
    """One bundled kernel. `kernel(*args, interpret=False, **params)` is the public jitted wrapper;
    `reference(*args, **params)` is pure JAX and also runs in float64 under `jax.enable_x64()`."""

    name: str  # CLI name, e.g. "flash_attention"
    title: str  # one line
    replaces: str  # what XLA does without it and why that is slow
    signature: str  # the wrapper's Python signature as text
    tuned_for: str  # the production shapes its blocks were chosen at
    usage: str  # a short usage snippet
    kernel: Callable
    reference: Callable
    cases: Callable[[], list[Case]]
    # keyed by Case.dtype ("float32", "bfloat16"); gradients use "<dtype>.grad" where given
    # (a bf16 gradient summed over rows drifts more than the forward value), else "<dtype>"
    tolerances: dict[str, Tolerance]
    bench: Callable[..., BenchSetup]  # bench(blocks=None) -> BenchSetup; blocks from block_candidates
    block_candidates: tuple = ()  # block-size objects the bench/ sweep tries
    differentiable: bool = False  # has a custom_vjp backward kernel
    # bench(blocks=None, chip=None): the setup depends on the target's chip (fp8_matmul's mode)
    chip_bench: bool = False

    def bench_setup(self, blocks=None, chip=None) -> BenchSetup:
        """The bench setup at `blocks` (the defaults for None) for the target's `targets.Chip`."""
        return self.bench(blocks, chip=chip) if self.chip_bench else self.bench(blocks)

    def describe(self) -> dict:
        return {"name": self.name, "title": self.title, "replaces": self.replaces,
                "signature": self.signature, "tuned_for": self.tuned_for, "usage": self.usage,
                "differentiable": self.differentiable,
                "tolerances": {k: v.to_dict() for k, v in sorted(self.tolerances.items())}}
