"""tpudiag: tells a JAX user why their program is slow on a TPU, and what to do about it.

Importing this package is cheap: it does not import jax (the CLI must start instantly and the
profiled child must set its dump flags before jax loads).

    import tpudiag
    result = tpudiag.compile(f, x_spec, w_spec, target="v5e")   # TPU compiler estimates, no TPU needed
    result.report.to_dict()["modules"][0]["ops"][:3]
"""

from tpudiag.version import __version__  # noqa: F401 - tpudiag.__version__


def validate(reference, candidate, inputs=None, **kwargs):
    """Check `candidate` against `reference` (callables or `FILE.py:FUNC`): values, gradients,
    determinism, in several input regimes, against float64; see `tpudiag.api.validate.validate`.
    Returns a `ValidateResult`: `assert result.ok, result.summary()`."""
    from tpudiag.api.validate import validate as run

    return run(reference, candidate, inputs, **kwargs)


def compile(fn, *args, target: str = "v5e", **kwargs):  # noqa: A001 - the name users expect
    """Compile `fn(*args)` for a TPU target on this machine; see `tpudiag.api.compile_function`."""
    from tpudiag.api import compile_function

    return compile_function(fn, *args, target=target, **kwargs)


def estimate(entry: str, target: str, argv=(), **kwargs):
    """Estimate one step of `entry` ("FILE.py:FUNC") at scale on a TPU slice, without running it;
    see `tpudiag.api.estimate.estimate`. Returns (run directory, `EstimateReport`):
    `tpudiag.estimate("llama_train.py:step", "v6e-256", ["--layers", "32", ...])[1].mfu`."""
    from tpudiag.api.estimate import estimate as run

    return run(entry, target, list(argv), **kwargs)
