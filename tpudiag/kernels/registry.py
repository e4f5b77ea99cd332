"""The bundled kernels by name. Importing a kernel module imports jax, so this imports lazily."""

from __future__ import annotations

import importlib

from tpudiag.errors import InputError

# module name under tpudiag.kernels, in the order `tpudiag kernels list` shows them
MODULES = ("flash_attention", "paged_attention", "rmsnorm", "cross_entropy", "rope", "sampling",
           "int8_matmul", "grouped_matmul", "w8a8_matmul", "int4_matmul", "fp8_matmul", "mla_decode",
           "ragged_paged_attention", "fused_moe")


def all_specs() -> list:
    specs = []
    for mod in MODULES:
        spec = importlib.import_module(f"tpudiag.kernels.{mod}").SPEC
        specs.extend(spec if isinstance(spec, tuple) else (spec,))
    return specs


def get_spec(name: str):
    specs = {s.name: s for s in all_specs()}
    if name not in specs:
        raise InputError(f"no bundled kernel named {name!r}; known: {', '.join(specs)}")
    return specs[name]
