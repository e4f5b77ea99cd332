"""The grading process: `python -m tpudiag.challenge.child TASK_DIR SOLUTION.py SEED OUT.json`.

Runs in its own process (grade.py kills it past the time limit: a solution that hangs). Loads the
solution, checks its signature, then judges correctness (the parity harness, parity/harness.py, at
the public and hidden shapes), determinism and the dynamic half of integrity (state kept between
calls; an output that ignores its input). Writes one JSON document to OUT.json: `load_error` (the
solution did not import or has the wrong signature) or one entry per criterion {ok, why}. Scores
nothing; grade.py does.

Every check but the state check calls the solution from a freshly loaded module, so that a solution
which keeps state fails integrity alone, not every criterion at once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import json
import os
import sys
from pathlib import Path

_counter = itertools.count()


def load_fresh(path: Path, function: str):
    """The solution's `function` from a new module object (its top level run again)."""
    path = Path(path).resolve()
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = f"_challenge_solution_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise LookupError(f"{path.name} defines no function {function}()")
    return fn


def _signature_error(fn, names: tuple[str, ...], function: str) -> str | None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    missing = [n for n in names if n not in params]
    required = [n for n, p in params.items() if p.default is p.empty and n not in names
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing or required:
        return (f"wrong signature: {function}{inspect.signature(fn)}; the task calls {function}({', '.join(names)})")
    return None


def _generator(specs):
    """(seed, regime) -> {name: array}: the harness's draws, plus `zero_rows` (normal values with every
    fourth row of each float argument of two or more dimensions all zeros)."""
    import numpy as np

    from tpudiag.parity import inputs as inp

    def make(seed, regime):
        arrays = inp.make_args(specs, "normal" if regime == "zero_rows" else regime, seed)
        if regime == "zero_rows":
            arrays = [a.copy() for a in arrays]
            for a in arrays:
                if a.ndim >= 2 and (np.issubdtype(a.dtype, np.floating) or str(a.dtype) == "bfloat16"):
                    a.reshape(-1, a.shape[-1])[::4] = 0
        return {s.name: a for s, a in zip(specs, arrays)}
    return make


def _call(fn, named: dict):
    import jax.numpy as jnp

    from tpudiag.parity.sides import leaves

    kw = {n: jnp.asarray(a) for n, a in named.items()}
    try:
        if "interpret" in inspect.signature(fn).parameters:
            kw["interpret"] = True
    except (TypeError, ValueError):
        pass
    return leaves(fn(**kw))


def _same(a: list, b: list) -> bool:
    import numpy as np

    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and
                                    np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a, b))


def correctness(task, solution: Path, seed: int) -> dict:
    from tpudiag.parity import inputs as inp
    from tpudiag.parity.harness import validate_pair
    from tpudiag.parity.sides import load_function, side

    ref = side(load_function(f"{task.reference_path}:{task.reference_function}", "reference"), "reference")

    def candidate(*args, **kwargs):  # a fresh module per call: state is integrity's business, not this one's
        return load_fresh(solution, task.function)(*args, **kwargs)

    probe = side(load_fresh(solution, task.function), "candidate")  # its kind: JAX, or NumPy, or PyTorch
    candidate.__signature__ = inspect.signature(probe.fn)
    cand = dataclasses.replace(side(candidate, "candidate"), kind=probe.kind, label=f"{solution.name}:{task.function}")
    failures, shapes = [], []
    for where, spec in [("public", task.public)] + [("hidden", h) for h in task.hidden]:
        specs = inp.parse_spec(spec)
        shapes.append(where)
        try:
            result = validate_pair(ref, cand, generator=_generator(specs), regimes=task.regimes, determinism=False,
                                   seed=seed, shrink_failures=False, inputs_text=spec, grad=task.grad)
        except Exception as e:  # the harness refused the pair at these shapes (an output of another shape)
            failures.append(f"{where} {spec}: {' '.join(str(e).split())[:300]}")
            continue
        for case in result.failures:
            failures.append(f"{where} [{case.regime}] {case.inputs}: {' '.join(case.why.split())[:300]}")
    n = len(shapes) * len(task.regimes)
    if failures:
        return {"ok": False, "why": f"{len(failures)} of {n} case(s) failed; " + "; ".join(failures[:3])}
    graded = "values and gradients" if task.grad else "values"
    return {"ok": True, "why": f"{n} case(s) pass, {graded} ({len(task.hidden)} hidden shape(s), regimes "
                               f"{', '.join(task.regimes)})"}


def dynamic_checks(task, solution: Path, seed: int) -> dict:
    """Determinism and the dynamic integrity checks, at the public shapes."""
    from tpudiag.parity import inputs as inp

    make = _generator(inp.parse_spec(task.public))
    a, b = make(seed, "normal"), make(seed + 1, "normal")
    out_a = _call(load_fresh(solution, task.function), a)
    again = _call(load_fresh(solution, task.function), a)
    det = {"ok": _same(out_a, again), "why": "two calls on the same input return the same bits"}
    if not det["ok"]:
        det["why"] = "two calls on the same input returned different outputs"
    out_b = _call(load_fresh(solution, task.function), b)
    problems = []
    if any(_same([x], [y]) for x, y in zip(out_a, out_b)):
        problems.append("an output did not change when the input changed")
    one = load_fresh(solution, task.function)
    first, second, third = _call(one, a), _call(one, b), _call(one, a)
    if not _same(first, third) or not _same(second, out_b):
        problems.append("state kept between calls: calls on A, B, A from one module differ from fresh calls")
    integ = {"ok": not problems, "why": "; ".join(problems) or "no state kept between calls; outputs follow inputs"}
    return {"determinism": det, "integrity": integ}


def main(argv: list[str]) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # interpret mode on the CPU; no TPU probe
    task_dir, solution, seed, out = Path(argv[0]), Path(argv[1]), int(argv[2]), Path(argv[3])
    from tpudiag.challenge.task import load_task
    from tpudiag.parity import inputs as inp

    task = load_task(task_dir)
    doc: dict = {"load_error": None, "criteria": {}}
    try:
        fn = load_fresh(solution, task.function)
        doc["load_error"] = _signature_error(fn, tuple(s.name for s in inp.parse_spec(task.public)), task.function)
    except BaseException as e:  # an import that raises, or exits: the grade fails with the reason
        doc["load_error"] = f"the solution does not import: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if doc["load_error"] is None:
        for name, run in (("correctness", lambda: {"correctness": correctness(task, solution, seed)}),
                          ("dynamic", lambda: dynamic_checks(task, solution, seed))):
            try:
                doc["criteria"].update(run())
            except Exception as e:
                why = f"the solution raised: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                keys = ("correctness",) if name == "correctness" else ("determinism", "integrity")
                doc["criteria"].update({k: {"ok": False, "why": why} for k in keys})
    out.write_text(json.dumps(doc))


if __name__ == "__main__":
    main(sys.argv[1:])
