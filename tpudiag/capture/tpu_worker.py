"""Compiles one module for a TPU topology with libtpu's compile-only client, in its own process.

`python -m tpudiag.capture.tpu_worker SPEC.json [SPEC.json ...]` reads {input, kind ("mlir" |
"hlo"), topology, out_dir} from each, compiles, and writes `out_dir/result.json` (status, compile time, XLA's cost and memory
analysis, partitioning) and `out_dir/optimized.hlo.txt`. The TPU compiler's own dumps (LLO
bundles, static cycle profile, XLA's HLO dumps) are switched on by the parent through
LIBTPU_INIT_ARGS and XLA_FLAGS before this process starts; this module only compiles.

It runs alone in a process because the TPU compiler can abort the process (static-profile
failures) or grow past any sane memory limit; the parent (`tpu_compile.py`) survives that.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path

from tpudiag.capture import rundir
from tpudiag.parent_death import die_with_parent
from tpudiag.errors import one_line


def _load_module_text(path: Path, kind: str):
    """The computation as an MLIR module: StableHLO text/bytecode, or HLO text converted to StableHLO."""
    from jax._src.lib.mlir import ir

    if kind == "hlo":
        from jax._src.lib import _jax
        from jaxlib import _hlo

        module = _hlo.hlo_module_from_text(path.read_text())
        return ir.Module.parse(_jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto()))
    return ir.Module.parse(path.read_bytes())


def _partitioning(module) -> tuple[int, int]:
    attrs = module.operation.attributes
    get = lambda key: int(str(attrs[key]).split(":")[0].strip()) if key in attrs else 1  # noqa: E731
    return get("mhlo.num_replicas"), get("mhlo.num_partitions")


def _devices(module, topo, need: int) -> list:
    """The devices partition 0..need-1 run on: the module's `tpudiag.device_ids` order where the
    lowering recorded one (estimate_worker.py), else the topology's first `need`."""
    from tpudiag.capture.estimate_worker import DEVICE_IDS_ATTR

    attrs = module.operation.attributes
    if DEVICE_IDS_ATTR not in attrs:
        return list(topo.devices[:need])
    from jax._src.lib.mlir import ir

    ids = list(ir.DenseI32ArrayAttr(attrs[DEVICE_IDS_ATTR]))
    by_id = {d.id: d for d in topo.devices}
    if len(ids) != need or any(i not in by_id for i in ids):
        raise ValueError(f"the module's device order names {len(ids)} devices; the topology has ids "
                         f"{min(by_id)}..{max(by_id)} and the module needs {need}")
    return [by_id[i] for i in ids]


# Constants this small and of these types are a kernel's tables (splash attention's block masks).
_TABLE_MAX = 1 << 16
_TABLE_TYPES = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "pred")


def _kernel_tables(hlo_module, text: str) -> dict[str, list[int]]:
    """{constant name: its values, flat} for the small integer constants (up to _TABLE_MAX elements)
    of a module that has Pallas kernels (`tpu_custom_call`): the optimized HLO elides them as {...},
    and a kernel's scalar-prefetched tables (which reach it as such constants, often through a copy
    into VMEM) decide which of its grid steps do work (analyze/compile/kernel_body.py)."""
    types = "|".join(_TABLE_TYPES)
    if "tpu_custom_call" not in text or not re.search(rf" = (?:{types})\[[\d,]+\]\S* constant\(\{{\.\.\.\}}\)", text):
        return {}  # no kernel, or no integer constant the text elides
    try:
        from jaxlib._hlo import HloPrintOptions

        opts = HloPrintOptions()
        opts.print_large_constants = True
        opts.print_metadata = False
        full = hlo_module.to_string(opts)
    except Exception:  # noqa: BLE001 - the tables are an extra: a compile that succeeded stays a success
        return {}
    out = {}
    for line in full.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* constant\(([^()]*)\)", line)
        if not m or m.group(2) not in _TABLE_TYPES:
            continue
        size = 1
        for d in filter(None, m.group(3).split(",")):
            size *= int(d)
        literal = m.group(4).replace("true", "1").replace("false", "0")
        values = [int(v) for v in re.findall(r"-?\d+", literal)]
        if 1 < size <= _TABLE_MAX and len(values) == size:
            out[m.group(1)] = values
    return out


def compile_one(spec: dict) -> dict:
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from tpudiag.targets import topology_desc

    t0 = time.perf_counter()
    topo = topology_desc(spec["topology"])
    with mlir.make_ir_context():
        module = _load_module_text(Path(spec["input"]), spec["kind"])
        replicas, partitions = _partitioning(module)
        need = replicas * partitions
        if need > len(topo.devices):
            raise ValueError(f"the module needs {need} devices; topology {spec['topology']} has {len(topo.devices)}")
        devices = _devices(module, topo, need)
        opts = compiler.get_compile_options(num_replicas=replicas, num_partitions=partitions,
                                            device_assignment=np.array(devices).reshape(replicas, partitions))
        t1 = time.perf_counter()
        executable = devices[0].client.compile(module, executable_devices=xc.DeviceList(tuple(devices)),
                                               compile_options=opts)
        compile_s = time.perf_counter() - t1
    out = Path(spec["out_dir"])
    hlo_module = executable.hlo_modules()[0]
    text = hlo_module.to_string()
    (out / rundir.MODULE_HLO).write_text(text)
    tables = _kernel_tables(hlo_module, text)
    if tables:
        (out / rundir.KERNEL_TABLES).write_text(json.dumps(tables, sort_keys=True))
    cost = executable.cost_analysis() or {}
    if isinstance(cost, list):  # older jaxlibs return one dict per partition
        cost = cost[0] if cost else {}
    mem = executable.get_compiled_memory_stats()
    # Each logical device's place on the slice (x, y, z): how far apart a collective's ring
    # neighbours are (analyze/compile/collectives.py).
    coords = [list(getattr(d, "coords", ()) or ()) for d in devices]
    return {
        "device_coords": coords if all(coords) else None,
        "status": "ok",
        "compile_s": round(compile_s, 6),
        "setup_s": round(t1 - t0, 6),
        "replicas": replicas,
        "partitions": partitions,
        "cost": {k: float(cost[k]) for k in ("flops", "bytes accessed", "transcendentals", "optimal_seconds")
                 if k in cost},
        "memory": {
            "argument_bytes": int(mem.argument_size_in_bytes),
            "output_bytes": int(mem.output_size_in_bytes),
            "alias_bytes": int(mem.alias_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes),
            "generated_code_bytes": int(mem.generated_code_size_in_bytes),
        },
    }


def main() -> None:
    # Several specs: modules compiled one after another in this one process (the setup modules of a
    # script, which need no dumps), each result written as soon as it is known.
    die_with_parent()
    for arg in sys.argv[1:]:
        spec = json.loads(Path(arg).read_text())
        out = Path(spec["out_dir"])
        print(f"== {spec['input']}", flush=True)
        try:
            result = compile_one(spec)
        except Exception as e:  # the compiler rejected the module: a reported failure, not a crash
            traceback.print_exc()
            # XLA errors carry a long tail (stack traces, source locations): the first line is the message.
            result = {"status": "failed", "error": " ".join(one_line(e, 500).split())}
        (out / rundir.MODULE_RESULT).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
