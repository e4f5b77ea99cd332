"""Runs a user's step function for real on the attached TPU and times it: the measured check of an
estimate (`plan` on a one-chip slice checks its top candidate so).

`python -m tpudiag.capture.step_timer SPEC.json` reads {file, func, argv, mesh ([[axis, size], ...],
every size 1: one chip), calls, out, platform ("tpu", the default; "cpu" runs the same on the host)}; calls `FUNC(argv, mesh)` with the mesh on the chip's one
device (the contract `estimate` uses: {"step": a jitted function, "args": ShapeDtypeStructs with
shardings, "tokens"}), makes arguments of those shapes on the chip (floats drawn N(0, 0.02²), so
routing and masking see varied values; integers 0), and runs the step 2 times to compile and warm
up, then `calls` times, each until its outputs are ready. Arguments the step donates are made again
between calls, outside the timed span. Writes `out` as {"device", "step_s": [one per call],
"tokens"}; a failure is {"error": one line}. Exit 3: no TPU backend.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tpudiag.errors import one_line

EXIT_NO_TPU = 3
WARMUP = 2


def _materializer(args):
    """A function seed -> arrays on the chip in the shapes, dtypes and shardings of `args` (a pytree of
    ShapeDtypeStructs), compiled once: a jit a leaf compiled 193 times for a 2-layer step, and again
    for every refill of donated state (that step's check on a CPU: 90 s, now 17 s)."""
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(args)
    shardings = [getattr(sds, "sharding", None) for sds in leaves]

    def make(key):
        out = []
        for k, sds in zip(jax.random.split(key, len(leaves)), leaves):
            if jnp.issubdtype(sds.dtype, jnp.floating):
                out.append((jax.random.normal(k, tuple(sds.shape), jnp.float32) * 0.02).astype(sds.dtype))
            else:
                out.append(jnp.zeros(tuple(sds.shape), sds.dtype))
        return tuple(out)

    if all(s is not None for s in shardings):
        made = jax.jit(make, out_shardings=tuple(shardings))
    else:  # some leaves unplaced: placed where jit puts them, the others where their sharding says
        jitted = jax.jit(make)
        made = lambda key: tuple(x if s is None else jax.device_put(x, s)  # noqa: E731
                                 for x, s in zip(jitted(key), shardings))
    return lambda seed: jax.tree.unflatten(tree, list(made(jax.random.key(seed))))


def _deleted(args) -> bool:
    import jax

    return any(getattr(a, "is_deleted", lambda: False)() for a in jax.tree.leaves(args))


def time_step(spec: dict) -> dict:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from tpudiag.capture.estimate_worker import Refused, _check, _func

    where = f"{spec['file']}:{spec['func']}"
    fn = _func(spec["file"], spec["func"])
    names = tuple(a for a, _ in spec["mesh"]) or ("fsdp",)
    sizes = tuple(int(n) for _, n in spec["mesh"]) or (1,)
    if int(np.prod(sizes)) != 1:
        raise Refused(f"{where}: a measured check runs on one chip; the mesh has {int(np.prod(sizes))} devices")
    mesh = Mesh(np.array(jax.devices(spec.get("platform", "tpu"))[:1]).reshape(sizes), names)
    got = _check(fn(list(spec["argv"]), mesh), where)
    if "lowered" in got:
        raise Refused(f"{where}: returns a lowered step, which cannot run; a measured check needs 'step' and 'args'")
    step, args = got["step"], tuple(got["args"])
    materialize = _materializer(args)
    live = materialize(0)
    times = []
    for i in range(WARMUP + int(spec["calls"])):
        if _deleted(live):  # donated to the last call
            live = materialize(i)
            jax.block_until_ready(live)
        t = time.perf_counter()
        jax.block_until_ready(step(*live))
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
    return {"device": mesh.devices.flat[0].device_kind, "step_s": times, "tokens": int(got["tokens"])}


def main() -> int:
    from tpudiag.parent_death import die_with_parent

    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    import jax

    try:
        jax.devices(spec.get("platform", "tpu"))
    except RuntimeError as e:
        print(one_line(e, 400), file=sys.stderr)
        return EXIT_NO_TPU
    try:
        doc = time_step(spec)
    except Exception as e:  # the user's code, jax, or a refusal: one line, the traceback in the log
        import traceback

        traceback.print_exc()
        doc = {"error": f"{spec['file']}:{spec['func']}: {one_line(e, 400)}"}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if "error" not in doc else 1


if __name__ == "__main__":
    raise SystemExit(main())
