"""Lowers a user's step function for a TPU slice without materializing anything, in its own process.

`python -m tpudiag.capture.estimate_worker SPEC.json` reads {file, func, argv, topology, devices (how many of
the topology's devices the mesh spans: one chip's for a single-chip target), mesh
([[axis, size], ...]), out_dir}; builds the slice's `Mesh` from the topology's devices (libtpu's
compile-only client: no TPU needed), calls `FUNC(argv, mesh)`, which returns
{"step": a jitted function, "args": its abstract arguments (ShapeDtypeStructs with shardings),
"tokens": tokens one step processes, "model": {...} (optional: parameter count and attention
dimensions)}, or, for a step that must be lowered inside its own context (MaxText's mesh and axis
rules: `maxtext_step.py`), {"lowered": a `jax.stages.Lowered` for TPU, "tokens", "model",
"mesh": [[axis, size], ...] (the mesh it built)}; lowers the step for TPU and writes `out_dir/step.mlir` and `out_dir/lowered.json`
(tokens, model, mesh); a failure is `out_dir/error.json` with one line naming the file and the
problem. FUNC's signature is checked before it is called: one that cannot be called as
FUNC(argv, mesh) is refused (exit 2), as a missing FUNC is. Compiling the lowered module is
`tpu_compile.py`'s job, as for every other input.
"""

from __future__ import annotations

import difflib
import inspect
import json
import runpy
import sys
import traceback
from pathlib import Path

from tpudiag.capture.lower import lower_for_tpu
from tpudiag.errors import InputError, one_line
from tpudiag.parent_death import die_with_parent


class Refused(Exception):
    """The user's file or function is not what `estimate` needs (a one-line reason)."""


def _func(file: str, name: str):
    try:
        scope = runpy.run_path(file, run_name="__tpudiag_estimate__")
    except SystemExit as e:
        raise Refused(f"{file}: the program exited while being imported (sys.exit({e.code!r})); keep its run "
                      "under `if __name__ == \"__main__\":`") from None
    fn = scope.get(name)
    if fn is None:
        defined = sorted(k for k, v in scope.items() if callable(v) and not k.startswith("_"))
        close = difflib.get_close_matches(name, defined, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise Refused(f"{file}: no function {name!r} ({hint}defined: {', '.join(defined[:12])}"
                      f"{', ...' if len(defined) > 12 else ''})")
    if not callable(fn):
        raise Refused(f"{file}: {name} is not a function ({type(fn).__name__} value); estimate calls "
                      f"{name}(argv, mesh)")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a signature (a builtin): the call will say
        return fn
    try:
        signature.bind([], None)
    except TypeError as e:
        raise Refused(f"{file}: {name}{signature} cannot be called as {name}(argv, mesh): {e}") from None
    return fn


def _check(spec, where: str) -> dict:
    if not isinstance(spec, dict):
        raise Refused(f"{where} returned {type(spec).__name__}; it must return a dict with 'step', 'args' and 'tokens'")
    needs = ("lowered", "tokens") if "lowered" in spec else ("step", "args", "tokens")
    missing = [k for k in needs if k not in spec]
    if missing:
        raise Refused(f"{where} returned a dict without {', '.join(repr(k) for k in missing)} "
                      "(needs 'step', 'args', 'tokens', optionally 'model')")
    if "lowered" in spec:
        if not hasattr(spec["lowered"], "as_text"):
            raise Refused(f"{where}: 'lowered' must be a jax Lowered (got {type(spec['lowered']).__name__})")
    elif not hasattr(spec["step"], "trace"):
        raise Refused(f"{where}: 'step' must be a jax.jit-ed function (got {type(spec['step']).__name__})")
    if "lowered" not in spec and not isinstance(spec["args"], (tuple, list)):
        raise Refused(f"{where}: 'args' must be a tuple of the step's arguments (got {type(spec['args']).__name__})")
    tokens = spec["tokens"]
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
        raise Refused(f"{where}: 'tokens' must be a positive int (got {tokens!r})")
    if not isinstance(spec.get("model", {}), dict):
        raise Refused(f"{where}: 'model' must be a dict")
    return spec


DEVICE_IDS_ATTR = "tpudiag.device_ids"


def _with_device_order(lowered, device_ids) -> str:
    """The lowered step's StableHLO text. Where the step's own mesh orders the slice's devices
    otherwise than the topology lists them (MaxText's `create_device_mesh` lays a ring along the
    torus), that order rides along as the module attribute `tpudiag.device_ids`: the compile worker
    assigns partition i to device device_ids[i], as `lowered.compile()` would. Without it the
    compiler gets the topology's order, another physical ring, and other collective buffers."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    module = lowered.compiler_ir("stablehlo")
    ids = [int(i) for i in device_ids or ()]
    if ids and ids != sorted(ids):
        with module.context:
            module.operation.attributes[DEVICE_IDS_ATTR] = ir.DenseI32ArrayAttr.get(ids)
    return mlir.module_to_string(module, enable_debug_info=True)


def lower(spec: dict) -> dict:
    import numpy as np
    from tpudiag.targets import topology_desc
    from jax.sharding import Mesh

    where = f"{spec['file']}:{spec['func']}"
    fn = _func(spec["file"], spec["func"])
    topo = topology_desc(spec["topology"])
    devices = list(topo.devices)[: spec.get("devices") or None]  # a single-chip target: one chip's
    names = tuple(a for a, _ in spec["mesh"]) or ("fsdp",)
    sizes = tuple(int(n) for _, n in spec["mesh"]) or (len(devices),)
    if int(np.prod(sizes)) != len(devices):
        shown = ",".join(f"{a}={n}" for a, n in zip(names, sizes))
        raise Refused(f"--mesh {shown} has {int(np.prod(sizes))} devices; {spec['topology']} has {len(devices)}")
    mesh = Mesh(np.array(devices).reshape(sizes), names)
    got = _check(fn(list(spec["argv"]), mesh), where)
    out = Path(spec["out_dir"])
    if "lowered" in got:
        (out / "step.mlir").write_text(_with_device_order(got["lowered"], got.get("device_ids")))
        names = tuple(str(a) for a, _ in got.get("mesh") or ()) or names
        sizes = tuple(int(n) for _, n in got.get("mesh") or ()) or sizes
    else:
        lower_for_tpu(got["step"], got["args"], out / "step.mlir", jitted=True)
    doc = {"tokens": int(got["tokens"]), "model": got.get("model") or {}, "mesh": [[a, n] for a, n in zip(names, sizes)],
           "devices": len(devices)}
    (out / "lowered.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def main() -> int:
    """The worker's exit code: 0, 2 (the file or FUNC is not what estimate needs), 1 (FUNC or jax failed)."""
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out_dir"])
    try:
        lower(spec)
    except (Refused, InputError) as e:
        (out / "error.json").write_text(json.dumps({"error": str(e), "kind": "input"}) + "\n")
        return 2
    except Exception as e:  # the user's code or jax failed: say where, keep the traceback in the log
        traceback.print_exc()
        (out / "error.json").write_text(json.dumps(
            {"error": f"{spec['file']}:{spec['func']}: {one_line(e, 400)}", "kind": "program"}) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())  # a worker process: its exit code is its result, read by api/estimate.py
