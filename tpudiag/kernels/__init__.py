"""The bundled reference Pallas TPU kernels (one module per kernel family), their verifier and bench.

`registry.all_specs()` lists them; each module's `SPEC` (spec.KernelSpec) says what it replaces, how to
call it, how to verify it on CPU and what to compile for the benchmark. Importing a kernel module
imports jax; this package's `__init__` does not.
"""
