"""The compiler's cycles for one grid step of each Pallas kernel of a kept estimate run, beside the MXU
work the estimate counts for it (docs/estimate.md: Pallas kernels with no cost estimate).

The estimate times a kernel that gives no cost estimate (JAX's splash attention) by its body's
matmuls at the MXU peak over the grid steps its mask tables run: a floor, which leaves out each
block's softmax and the scores' trips through VMEM. The kernel's own static profile does not give
its time: its blocks run under branches on the mask tables, which the static model does not follow.
This probes each such kernel with its body rewritten: the grid cut to 2 and then 3 steps along its
last axis (the others to 1; a last axis of 3 steps or fewer is not probed, so that neither probe
reaches the axis's last step, where a kernel writes its output block back), and every `scf.if` whose
condition reads one of its scalar-prefetched tables made to hold. Each probe is the custom call
alone, written as StableHLO (an HLO text of it does not convert for libtpu's plugin), compiled for
the run's target with the run's compiler flags and the static profile, loops stepped through. The
per-step figure is the difference over the extra step (the first step's DMA and the row's write-back
left out); times the active steps the estimate counted (its matmul work over one step's, exact where
every matmul is under a table branch, as in splash), it is what the kernel would take if every
active step ran as these do. It is a what-if beside the estimate, not applied to it; nothing is
fitted.

    python bench/splash_step_probe.py RUN [--out DIR]        # RUN: a kept `tpudiag estimate` run

Python >= 3.12 with the jax that compiled RUN (its kernel bodies are that Mosaic's).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

_TYPES = {"bf16": "bf16", "f32": "f32", "f16": "f16", "s8": "i8", "s16": "i16", "s32": "i32", "u8": "ui8",
          "u32": "ui32", "pred": "i1"}


def _tensor(shape: str) -> str:
    m = re.match(r"(\w+)\[([\d,]*)\]", shape)
    dims = [d for d in m.group(2).split(",") if d]
    return "tensor<" + "".join(f"{d}x" for d in dims) + _TYPES[m.group(1)] + ">"


def _reads_table(value, tables, depth: int = 0) -> bool:
    """Whether `value` is computed from a load of one of `tables` (the scalar-prefetch arguments)."""
    from jaxlib.mlir import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or depth > 16:
        return False
    if owner.name == "memref.load" and any(owner.operands[0] == t for t in tables):
        return True
    return any(_reads_table(v, tables, depth + 1) for v in owner.operands)


def _force_table_branches(block, tables) -> int:
    """Every `scf.if` under `block` whose condition reads one of `tables` made to hold; returns how
    many."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith

    forced = 0
    for op in block.operations:
        if op.operation.name == "scf.if" and _reads_table(op.operation.operands[0], tables):
            with ir.InsertionPoint(op):
                true = arith.ConstantOp(ir.IntegerType.get_signless(1), 1)
            op.operation.operands[0] = true.result
            forced += 1
        for region in op.operation.regions:
            for inner in region.blocks:
                forced += _force_table_branches(inner, tables)
    return forced


def _probe_text(instr, operands, steps: int) -> tuple[str, int] | None:
    """(the StableHLO module of `instr` alone with its grid cut to `steps` along its last axis (the
    others to 1) and its branches on its scalar-prefetched tables made to hold, how many branches were
    forced); None where that axis has fewer than STEPS[1] + 1 steps (the probe must not reach the
    axis's last step, where a kernel writes its output block back)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    from tpudiag.analyze.compile.kernel_body import _module, kernel_body

    config = json.loads(json.dumps(instr.backend_config))
    ctx, module = _module(kernel_body(config))
    forced = 0
    with ctx, ir.Location.unknown():
        for op in module.body.operations:
            if "iteration_bounds" in op.operation.attributes:
                attrs = op.operation.attributes
                bounds = [int(x) for x in re.findall(r"(?<![\w.])\d+", str(attrs["iteration_bounds"]))]
                prefetch = re.findall(r"(?<![\w.])\d+", str(attrs["scalar_prefetch"])) if "scalar_prefetch" in attrs \
                    else ["0"]
                if bounds[-1] <= STEPS[1]:
                    return None
                attrs["iteration_bounds"] = ir.DenseI64ArrayAttr.get([1] * (len(bounds) - 1) + [steps])
                entry = op.operation.regions[0].blocks[0]
                tables = list(entry.arguments)[len(bounds):len(bounds) + int(prefetch[0])]
                forced = _force_table_branches(entry, tables)
        PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(module.operation)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf, desired_version=0)
    config["custom_call_config"].pop("debug_locations", None)  # they name the original body's ops
    config["custom_call_config"]["body"] = base64.b64encode(buf.getvalue()).decode()
    args = [_tensor(o.shape) for o in operands]
    results = [_tensor(s) for s in re.findall(r"\w+\[[\d,]*\]", instr.shape)]
    escaped = json.dumps(config).replace("\\", "\\5C").replace('"', "\\22")
    n = len(results)
    out_type = f"({', '.join(results)})" if n > 1 else results[0]
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    lines = [
        "module @kernel_step_probe attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {",
        f"  func.func public @main({params}) -> ({', '.join(results)}) {{",
        f"    %0{':' + str(n) if n > 1 else ''} = stablehlo.custom_call @tpu_custom_call("
        f"{', '.join(f'%a{i}' for i in range(len(args)))}) {{backend_config = \"{escaped}\"}} : "
        f"({', '.join(args)}) -> {out_type}",
        f"    return {', '.join(f'%0#{i}' if n > 1 else '%0' for i in range(n))} : {', '.join(results)}",
        "  }", "}"]
    return "\n".join(lines) + "\n", forced


# The probes' grid steps along the last axis: the per-step figure is the difference over the extra step.
STEPS = (2, 3)


def _cycles(text: str, name: str, topology: str, out: Path) -> int | None:
    from tpudiag.api.pipeline import compile_inputs
    from tpudiag.capture.tpu_compile import Limits, ModuleInput
    from tpudiag.targets import resolve_target

    target = resolve_target(topology)
    path = out / f"{name}.mlir"
    path.write_text(text)
    limits = replace(Limits(), static_timeout_s=300.0, scale_with_size=False, fast_forward=False, llo_dump=False)
    report = compile_inputs([ModuleInput(name=name, path=path, kind="mlir")], out, target, static_profile=True,
                            jobs=1, limits=limits, suggestions=False, group_setup=False, with_llo=False)
    m = report.modules[0]
    got = [o.estimated_cycles for o in m.ops if o.opcode == "custom-call" and o.cycles_source == "static_profile"]
    return got[0] if m.ok and got else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a kept `tpudiag estimate` run directory")
    ap.add_argument("--out", default=None, help="keep the probes here (default: a temporary directory)")
    a = ap.parse_args()

    from tpudiag.analyze.compile.kernel_body import kernel_body, kernel_work
    from tpudiag.api.estimate import _table_source
    from tpudiag.api.pipeline import compile_run_artifacts
    from tpudiag.capture import rundir
    from tpudiag.errors import TpudiagError
    from tpudiag.analyze.hlo.cost import has_cost_estimate

    run = Path(a.run)
    try:
        arts, report = compile_run_artifacts(run, with_llo=False, suggestions=False)
    except (TpudiagError, OSError) as e:
        print(f"splash_step_probe: {run}: not a kept compile or estimate run ({e})", file=sys.stderr)
        return 2
    hlo, m, target = arts[0].hlo, report.modules[0], report.target
    # the run's compiler flags (MaxText's scoped VMEM limit among them: without it a large block can
    # run out of VMEM) reach the probes as they reached the step
    flags = (rundir.read_manifest(run).source or {}).get("libtpu_init_args")
    if flags:
        os.environ["LIBTPU_INIT_ARGS"] = flags
    tables_file = next((run / rundir.MODULES_DIR).glob(f"*/{rundir.KERNEL_TABLES}"), None)
    tables = json.loads(tables_file.read_text()) if tables_file else {}
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="kernel-step-probe-"))
    out.mkdir(parents=True, exist_ok=True)
    flops_per_cycle = target.peak_bf16_flops_per_s / target.clock_hz
    print(f"{run} on {target.topology}: per grid step, the kernel's static cycles (branches on its tables made "
          "to hold) against its matmuls at the MXU peak")
    first, second = (f"{n} steps" for n in STEPS)
    print(f"{'kernel op':42} {'runs':>4} {first:>9} {second:>9} {'per step':>9} {'MXU/step':>9} {'ratio':>6} "
          f"{'active':>7} {'counted':>9} {'as probed':>10}")
    seen = {}
    total_counted = total_probed = 0.0
    for o in m.ops:
        instr = hlo.instruction(o.name, o.computation) if o.opcode == "custom-call" else None
        if instr is None or instr.custom_call_target != "tpu_custom_call" or has_cost_estimate(instr):
            continue
        body = kernel_body(instr.backend_config)
        values = [tables.get(_table_source(hlo, hlo.operand(instr, k)) or "") for k in range(len(instr.operands))]
        work = kernel_work(body, values) if body else None
        if work is None or not work.flops:
            continue
        operands = [hlo.operand(instr, k) for k in range(len(instr.operands))]
        key = (body, tuple(x.shape for x in operands))
        if key not in seen:
            cycles = []
            for steps in STEPS:
                got = _probe_text(instr, operands, steps)
                cycles.append(_cycles(got[0], f"{o.name}-{steps}", target.topology, out) if got else None)
            seen[key] = cycles
        two, four = seen[key]
        per_step_mxu = work.dense_flops / work.steps / flops_per_cycle
        active = round(work.flops / (work.dense_flops / work.steps))
        counted = work.flops / target.peak_bf16_flops_per_s * o.runs
        if two is None or four is None:
            print(f"{o.name:42} {o.runs:>4} {'-':>9} {'-':>9}  (no cycles: a grid too short to probe, or the probe "
                  "failed to compile or profile)")
            continue
        per_step = (four - two) / (STEPS[1] - STEPS[0])
        probed = per_step * active / target.clock_hz * o.runs
        total_counted += counted
        total_probed += probed
        print(f"{o.name:42} {o.runs:>4} {two:>9,} {four:>9,} {per_step:>9,.0f} {per_step_mxu:>9,.0f} "
              f"{per_step / per_step_mxu:>5.2f}x {active:>7,} {counted:>8.4g}s {probed:>9.4g}s")
    if not seen:
        print("no Pallas kernel without a cost estimate of its own in this run")
        return 0
    if not total_counted:
        print(f"no probe gave cycles (their compile logs: {out}/modules/)")
        return 1
    print(f"all of them, x runs: {total_counted:.4g} s counted by the estimate (MXU peak), {total_probed:.4g} s "
          f"if every active step ran as probed (+{total_probed - total_counted:.4g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
