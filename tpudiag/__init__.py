"""tpudiag: tells a JAX user why their program is slow on a TPU, and what to do about it.

Importing this package is cheap: it does not import jax (the CLI must start instantly and the
profiled child must set its dump flags before jax loads).
"""

__version__ = "0.1.0"
