"""`tpudiag kernels verify`: run each kernel in Pallas interpret mode on CPU against its pure-JAX
reference and against that reference in float64, on fresh random inputs, and gradients against
`jax.grad` of the reference. With `on_chip`, each kernel is compiled for the attached TPU and runs
there instead (what interpret mode cannot show: the MXU's precision, Mosaic's lowering), the
reference on the chip at 'highest' matmul precision and the float64 reference on the CPU.

Reads the kernels' `SPEC`s; returns `VerifyResult` (JSON-safe via `to_dict`); prints nothing.
A kernel that raises is a failed case with the error text, not a crash of the verifier.
"""

from __future__ import annotations

import secrets
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np

from tpudiag.results.numerics import Check
from tpudiag.errors import one_line
from tpudiag.kernels.spec import Case, KernelSpec, Tolerance
from tpudiag.parity.harness import Outputs, compare_outputs
from tpudiag.results.kernels import CaseResult, VerifyResult


def tolerance_for(spec: KernelSpec, dtype: str, grad: bool = False) -> Tolerance:
    """The tolerance for `dtype`; gradients use `"<dtype>.grad"` where the spec gives one."""
    if grad and f"{dtype}.grad" in spec.tolerances:
        return spec.tolerances[f"{dtype}.grad"]
    if dtype not in spec.tolerances:
        raise KeyError(f"kernel {spec.name} gives no tolerance for {dtype}")
    return spec.tolerances[dtype]


def _leaves(x) -> list:
    import jax
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


def _checks(prefix: str, got, want, truth, tol: Tolerance, exact: bool) -> list[Check]:
    """The harness's three comparisons (kernel vs reference, kernel vs float64, reference vs
    float64) under the kernel's elementwise tolerance; a different number of outputs is one failed check."""
    g, w, t = _leaves(got), _leaves(want), _leaves(truth)
    if len(g) != len(w):
        return [Check(f"{prefix}kernel vs reference".strip(), False, "structure", None, None, None,
                      f"{len(g)} outputs, expected {len(w)}")]
    checks, _ = compare_outputs(Outputs(g, w, t), prefix.strip(), atol_rtol=(tol.atol, tol.rtol), exact=exact,
                                names=("kernel", "reference"))
    return checks


def _to_f64(args):
    import jax.numpy as jnp
    return tuple(a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args)


def _shapes(args) -> str:
    return ", ".join(f"{a.dtype}[{','.join(map(str, a.shape))}]" for a in args)


def _grads(fn, args, argnums, cts):
    """d/d args[argnums] of sum(out * ct) over every floating output of fn(*args)."""
    import jax
    import jax.numpy as jnp

    def loss(*diff):
        full = list(args)
        for i, a in zip(argnums, diff):
            full[i] = a
        outs = jax.tree_util.tree_leaves(fn(*full))
        return sum(jnp.sum(o.astype(ct.dtype) * ct) for o, ct in zip(outs, cts) if ct is not None)

    return jax.grad(loss, argnums=tuple(range(len(argnums))))(*(args[i] for i in argnums))


def run_case(spec: KernelSpec, case: Case, key, on_chip: bool = False) -> CaseResult:
    import contextlib

    import jax
    import jax.numpy as jnp

    interpret = not on_chip
    # On the chip the reference's own dots run at full f32 precision; float64 always on the CPU.
    precise = jax.default_matmul_precision("highest") if on_chip else contextlib.nullcontext()
    cpu = jax.default_device(jax.devices("cpu")[0]) if on_chip else contextlib.nullcontext()
    t0 = time.perf_counter()
    args, checks = (), []
    try:
        args = tuple(case.make_args(key))
        tol = tolerance_for(spec, case.tolerance_key)
        kp, rp = case.all_kernel_params(), case.reference_params()
        out = spec.kernel(*args, interpret=interpret, **kp)
        with precise:
            ref = spec.reference(*args, **rp)
        with jax.enable_x64(), cpu:
            args64 = _to_f64(jax.device_put(args, jax.devices("cpu")[0]) if on_chip else args)
            ref64 = spec.reference(*args64, **rp)
            checks += _checks("", out, ref, ref64, tol, case.exact)
        if case.grad:
            gtol = tolerance_for(spec, case.tolerance_key, grad=True)
            ckey = jax.random.fold_in(key, 7919)
            cts = [jax.random.normal(jax.random.fold_in(ckey, n), o.shape, jnp.float32)
                   if jnp.issubdtype(o.dtype, jnp.floating) else None
                   for n, o in enumerate(jax.tree_util.tree_leaves(out))]
            g_k = _grads(lambda *a: spec.kernel(*a, interpret=interpret, **kp), args, case.grad_argnums, cts)
            with precise:
                g_r = _grads(lambda *a: spec.reference(*a, **rp), args, case.grad_argnums, cts)
            with jax.enable_x64(), cpu:
                cts64 = [None if c is None else c.astype(jnp.float64) for c in
                         (jax.device_put(cts, jax.devices("cpu")[0]) if on_chip else cts)]
                g_64 = _grads(lambda *a: spec.reference(*a, **rp), args64, case.grad_argnums, cts64)
            for n, argnum in enumerate(case.grad_argnums):
                checks += _checks(f"grad[{argnum}]", g_k[n], g_r[n], g_64[n], gtol, False)
        error = None
    except Exception as e:  # a kernel that fails is a failed case, reported with its cause
        error = one_line(e, 500)
        if e.__traceback__:  # where it was raised: the kernel module's file and line
            where = traceback.extract_tb(e.__traceback__)[-1]
            error += f" ({Path(where.filename).name}:{where.lineno})"
    return CaseResult(spec.name, case.label, case.dtype, _shapes(args), tuple(checks), error,
                      time.perf_counter() - t0)


def attached_tpu() -> str | None:
    """The attached TPU's kind ("TPU v5 lite"), or None: jax's default backend is not a TPU."""
    import jax

    try:
        devices = jax.devices()
    except RuntimeError:
        return None
    return devices[0].device_kind if devices and devices[0].platform == "tpu" else None


def tpu_backend_error() -> str:
    """Why jax has no TPU backend on a machine that has a TPU's device files: jax's own words (another
    program holding the chip says so there), one line."""
    import jax

    try:
        jax.devices("tpu")
    except RuntimeError as e:
        return one_line(e, 300)
    return "jax's default backend is not the TPU"


def verify_specs(specs: list[KernelSpec], seed: int | None = None,
                 progress: Callable[[CaseResult], None] | None = None, on_chip: bool = False) -> VerifyResult:
    """Verify every case of every spec. `seed` None draws a fresh one (recorded in the result).
    `on_chip`: compiled for the attached TPU (the caller checks there is one: `attached_tpu`)."""
    import jax

    device = attached_tpu() if on_chip else None
    seed = secrets.randbelow(2**31) if seed is None else seed
    base = jax.random.key(seed)
    results = []
    for s_index, spec in enumerate(specs):
        for c_index, case in enumerate(spec.cases()):
            r = run_case(spec, case, jax.random.fold_in(jax.random.fold_in(base, s_index), c_index), on_chip)
            results.append(r)
            if progress:
                progress(r)
    tols = {s.name: {k: v.to_dict() for k, v in sorted(s.tolerances.items())} for s in specs}
    return VerifyResult(seed, tuple(results), tols, "chip" if on_chip else "interpret", device)


def verify_spec(spec: KernelSpec, seed: int | None = None) -> VerifyResult:
    return verify_specs([spec], seed)
