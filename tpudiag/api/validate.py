"""`tpudiag validate REF CAND`: the parity harness (parity/harness.py) from the command line or
from Python.

    import tpudiag
    result = tpudiag.validate("ref.py:attention", my_flash, inputs="q=bf16[2,8,1000,128] ...", grad=True)
    assert result.ok, result.summary()

Loads the two functions and the inputs (a spec, a generator `FILE.py:FUNC`, or a callable),
runs every regime, and returns a `ValidateResult` (results/validate.py). Writes nothing but
the JUnit file when asked.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tpudiag.errors import InputError


def parse_static(items) -> dict:
    """`causal=True block=128 name=abc` (one string or several) -> {"causal": True, ...}: each value
    a Python literal where it parses as one, else the text."""
    out = {}
    for item in (items if isinstance(items, (list, tuple)) else [items]):
        for part in str(item).split():
            if "=" not in part:
                raise InputError(f"--static: {part!r} is not NAME=VALUE")
            name, value = part.split("=", 1)
            try:
                out[name] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                out[name] = value
    return out


def parse_bind(items) -> tuple[tuple[str, str], ...]:
    """`x=inp w=weight` (one string or several) -> (("x", "inp"), ("w", "weight"))."""
    out = []
    for item in (items if isinstance(items, (list, tuple)) else [items]):
        for part in str(item).split():
            name, _, param = part.partition("=")
            if not name.isidentifier() or not param.isidentifier():
                raise InputError(f"--bind: {part!r} is not INPUT=PARAM (an input's name, the candidate's parameter)")
            out.append((name, param))
    return tuple(out)


def validate(reference, candidate, inputs=None, *, static=None, grad: bool = False, regimes: str = "normal",
             seed: int | None = None, allow_nondeterminism: bool = False, shrink: bool = True,
             k: float | None = None, floor_eps: float | None = None, bind=None, eager: bool = False,
             unordered: int | None = None, strict_ties: bool = False, progress=None, junit_path=None):
    """Validate `candidate` against `reference` (each `FILE.py:FUNC`, `module:FUNC` or a callable).
    `inputs`: a spec (`"q=bf16[2,8,128,64] ..."`), a generator (`"gen.py:make_inputs"` or a callable
    `(seed, regime) -> args`). Inputs go to both sides by name; `bind` ({input: candidate's
    parameter} or "x=inp w=weight") renames them for the candidate. A JAX candidate runs jitted
    unless `eager`. `unordered`: integer outputs are compared as sets along that dimension (top-k
    indices in an unspecified order); `strict_ties`: discrete outputs break ties as the reference
    does (else ties are excluded and counted). Returns a `ValidateResult`."""
    import dataclasses

    from tpudiag.analyze.numerics import DEFAULT_NUMERICS
    from tpudiag.parity import inputs as inp
    from tpudiag.parity.harness import validate_pair
    from tpudiag.parity.sides import load_function, side

    if junit_path is not None:
        from tpudiag.outputs import check_output_file

        check_output_file(Path(junit_path))
    if inputs is None:
        raise InputError("--inputs is required: a spec (q=bf16[2,8,128,64] ...) or a generator FILE.py:FUNC")
    specs = generator = None
    if callable(inputs):
        generator, text = inputs, getattr(inputs, "__qualname__", "generator")
    elif "=" in str(inputs) or "[" in str(inputs):
        specs, text = inp.parse_spec(str(inputs)), str(inputs)
    else:
        generator, text = load_function(str(inputs), "input generator"), str(inputs)
    config = DEFAULT_NUMERICS
    if k is not None or floor_eps is not None:
        if (k is not None and k < 0) or (floor_eps is not None and floor_eps < 0):
            raise InputError("--k and --floor-eps are non-negative")
        config = dataclasses.replace(config, **{n: v for n, v in (("k", k), ("floor_eps", floor_eps)) if v is not None})
    ref, cand = side(reference, "reference"), side(candidate, "candidate", jit=not eager)
    if bind:
        cand = dataclasses.replace(cand, rename=tuple(bind.items()) if isinstance(bind, dict) else parse_bind(bind))
    result = validate_pair(ref, cand, specs=specs, generator=generator, regimes=inp.regimes_for(specs, regimes),
                           static=parse_static(static) if isinstance(static, (str, list, tuple)) else static,
                           grad=grad, determinism=not allow_nondeterminism, seed=seed, shrink_failures=shrink,
                           config=config, inputs_text=text, unordered=unordered,
                           strict_ties=strict_ties, progress=progress)
    if junit_path is not None:
        from tpudiag.capture import rundir
        from tpudiag.report.registry import render

        rundir.write_text_atomic(Path(junit_path), render(result, "junit"))
    return result
