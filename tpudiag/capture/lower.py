"""Lowers a JAX function for a TPU target on a machine without one, and writes the StableHLO text.

Reads a function and its arguments (arrays or `jax.ShapeDtypeStruct`s: only shapes, dtypes and
shardings matter); writes the module a compile worker (`tpu_compile.py`) takes as input. Pallas
kernels become Mosaic here: lowering is where a kernel's block sizes and VMEM use are checked. It
does not compile (that is `tpu_compile.py`) and keeps nothing in memory.

jax is imported inside the function: the CLI imports this module before it knows whether it
needs jax, and a worker sets its platform flags before jax loads.
"""

from __future__ import annotations

from pathlib import Path


def lower_for_tpu(fn, args, path: Path, *, debug_info: bool = True, jitted: bool = False,
                  topology: str | None = None, donate_argnums: tuple[int, ...] = ()) -> Path:
    """`fn(*args)` lowered for TPU, written as StableHLO text to `path`; returns `path`.

    `jitted`: `fn` is a `jax.jit`-ed function with its own shardings, lowered as it is (wrapping it
    in `jax.jit` again would nest it as a call in another module). `debug_info=False` leaves out
    source locations, which name the caller's stack: the same kernel lowered from another call path
    is then the same module to the compile cache.

    `topology` (a `Target.topology`): trace as for that chip. Kernels that read the chip they run on
    (`pltpu.get_tpu_info`: Mosaic's vector integer division, JAX's own kernels' block choices) see
    it through a one-device abstract mesh of it instead of this machine's CPU.

    `donate_argnums`: arguments the jitted `fn` may write in place (a KV cache), as `jax.jit`'s.
    """
    import contextlib

    import jax

    context = contextlib.nullcontext()
    if topology is not None:
        import numpy as np

        from tpudiag.targets import topology_desc

        device = topology_desc(topology).devices[:1]
        context = jax.sharding.use_abstract_mesh(jax.sharding.Mesh(np.array(device), ("x",)).abstract_mesh)
    with context:
        traced = (fn if jitted else jax.jit(fn, donate_argnums=donate_argnums)).trace(*args)
        lowered = traced.lower(lowering_platforms=("tpu",))
    path = Path(path)
    path.write_text(lowered.as_text(debug_info=debug_info))
    return path
