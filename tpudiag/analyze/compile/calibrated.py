"""The estimate's op times moved by a chip's measured calibration (results/calibration.py), where
the data sheet's figures price work the chip does slower. Each rule comes from one measurement:

- an HBM-bound op (its time from bytes at the data sheet's bandwidth) at the measured copy
  bandwidth (hbm_copy: x + 1 over 512 MiB);
- a compute-bound op at the MXU peak at the measured square-matmul rate of its dtype (mxu_bf16 /
  mxu_int8 / mxu_fp8);
- a bf16 matmul timed by its probe's static cycles (`matmul_probe`) at the chip's time for the square
  bf16 matmul over the compiler's static cycles for the same matmul (mxu_bf16_square, whose
  `static_cycles` the table records beside the time);
- the bundled flash attention kernels (`flash_attention_fwd|dq|dkv`), whose own cost estimates count
  their FLOPs, at the share of the peak each reached at the nearest measured head dim and sequence;
- a sort at the measured time per element (sort_f32);
- a gather or scatter op at the measured gather or scatter bandwidth, and a kCustom fusion around a
  scatter by all the bytes it accesses at the scatter bandwidth;
- an executed op faster than the least time the chip took for an op (op_smallest) at that time.

Otherwise an op the static profile or a probe timed from the compiler's cycles keeps those. Pure: takes the
compile report, the step's HLO and the calibration; returns the report with the ops' times, their
`calibrated` note, and one finding per rule. No I/O.
"""

from __future__ import annotations

from dataclasses import replace

from tpudiag.analyze.compile.passes import with_step
from tpudiag.analyze.hlo.vocabulary import (ASYNC_COPY, BOOKKEEPING, COLLECTIVE, CONTROL, IDS, SEND_RECV,
                                            TPU_ASYNC_SLICE)

FLASH_KERNELS = ("flash_attention_fwd", "flash_attention_dq", "flash_attention_dkv")
_NOT_EXECUTED = BOOKKEEPING | CONTROL | COLLECTIVE | SEND_RECV | TPU_ASYNC_SLICE | ASYNC_COPY | IDS | frozenset(
    {"reshape"})


def _kernel_of(o) -> str | None:
    if o.opcode != "custom-call":
        return None
    return next((k for k in FLASH_KERNELS if o.name == k or o.name.startswith(k + ".")), None)


def _attention_dims(hlo, o) -> tuple[int, int] | None:
    """(head dim, sequence) of the kernel's first 4-D operand (q [batch, heads, seq, head_dim])."""
    instr = hlo.instruction(o.name, o.computation) if hlo is not None else None
    if instr is None:
        return None
    for i in range(len(instr.operands)):
        op = hlo.operand(instr, i)
        shape = op.parsed_shape if op is not None else None
        if shape is not None and shape.is_array and shape.rank == 4:
            return int(shape.dims[-1]), int(shape.dims[-2])
    return None


def _elements(hlo, o) -> int:
    instr = hlo.instruction(o.name, o.computation) if hlo is not None else None
    op = hlo.operand(instr, 0) if instr is not None and instr.operands else None
    shape = op.parsed_shape if op is not None else None
    return shape.elements if shape is not None and shape.is_array else 0


def _wraps_scatter(hlo, o) -> bool:
    """Whether the op is a kCustom fusion around a scatter (the TPU's scatter emitter; `analyze/hlo`
    costs it as that op, as XLA does). XLA's cost analysis prices it by its FLOPs or the updated
    rows, while it reads and writes the whole operand: on a v5e the embedding gradient,
    bf16[32000,1024] from 8192 rows, took 325.9 us, its bytes at the measured scatter bandwidth 330
    (fixtures/tpu-v5e/llama_train)."""
    instr = hlo.instruction(o.name, o.computation) if hlo is not None else None
    return (instr is not None and instr.fusion_kind == "kCustom"
            and any(i.opcode == "scatter" for i in hlo.walk(instr.called[:1], into=("fusion",))))


def _int8(o) -> bool:
    text = (o.limit or "") + " " + (o.name or "")
    return "s8" in text or "int8" in text


def _dtype_rate(o, figures: dict, nominal):
    """(measured rate, nominal rate, source) for a compute-bound op's dtype."""
    if _int8(o):
        f = figures.get("mxu_int8_ops_per_s")
        return (f.value, nominal.peak_int8_ops_per_s, f.source) if f and nominal.peak_int8_ops_per_s else None
    f = figures.get("mxu_bf16_flops_per_s")
    return (f.value, nominal.peak_bf16_flops_per_s, f.source) if f else None


def calibrate_ops(report, hlo, calibration, chip, running_jax: str | None = None):
    """(the report with its step's ops moved by `calibration`, the findings); `chip` is the target's
    (targets.Chip: the data sheet's figures the estimate priced with). Where `running_jax` is not the
    version the table was measured with, a finding says so (the figures are used as measured)."""
    figures = calibration.figures(chip)
    m = report.modules[0]
    moved: dict[str, list] = {}  # rule -> [(op, seconds added per step)]
    ops = []
    for o in m.ops:
        new_s, why = _moved(o, hlo, figures, calibration, chip)
        if why is not None and abs(new_s - o.estimated_s) > 1e-3 * max(o.estimated_s, 1e-12):
            moved.setdefault(why[0], []).append((o.name, (new_s - o.estimated_s) * o.runs))
            o = replace(o, estimated_s=round(new_s, 12), calibrated=why[1])
        ops.append(o)
    notes = tuple(_note(rule, rows, calibration) for rule, rows in moved.items())
    if notes and running_jax and running_jax != calibration.jax:
        notes += (f"calibration ({calibration.chip}) measured with jax {calibration.jax}; this is jax {running_jax}: "
                  "its figures are used as measured (tpudiag calibrate on this version refreshes them)",)
    if not notes:
        return report, ()
    return with_step(report, replace(m, ops=tuple(ops), findings=(*m.findings, *notes))), notes


def _moved(o, hlo, figures, cal, chip) -> tuple[float, tuple[str, str] | None]:
    """(the op's calibrated time, (rule, the op's note)) or (its time, None)."""
    if o.modelled or o.opcode in _NOT_EXECUTED:
        return o.estimated_s, None
    timed = o.cycles_source in ("static_profile", "matmul_probe", "kernel_probe") and o.estimated_cycles
    if (o.cycles_source == "matmul_probe" and timed and not _int8(o)
            and (f := figures.get("mxu_bf16_static_ratio")) is not None):
        return o.estimated_s * f.value, ("probe", f"x{f.value:.3f} the probe's cycles ({f.source}: the chip's "
                                                  "time over the compiler's static cycles)")
    kernel = _kernel_of(o)
    if kernel is not None and not timed and o.flops > 0:
        d, seq = _attention_dims(hlo, o) or (128, 2048)
        share = cal.kernel_share(kernel, d, seq, chip.peak_bf16_flops_per_s)
        if share is not None:
            s = o.flops / (chip.peak_bf16_flops_per_s * share[0])
            return max(s, o.estimated_s), ("kernel", f"{kernel} at {share[0]:.0%} of the bf16 peak (head dim {d}, "
                                                     f"sequence {seq}; measured {share[1]})")
    if o.opcode == "sort" and (f := figures.get("sort_s_per_element")) is not None:
        n = _elements(hlo, o)
        if n:
            return max(o.estimated_s, n * f.value), ("sort", f"{n} elements at {f.value * 1e9:.3g} ns ({f.source})")
    if o.opcode in ("gather", "scatter") and o.bound_by == "hbm":
        f = figures.get(f"{o.opcode}_bytes_per_s")
        if f is not None and f.nominal:
            return o.estimated_s * f.nominal / f.value, (o.opcode, f"x{f.nominal / f.value:.2f} ({f.source})")
    if o.opcode == "fusion" and o.bytes_accessed and _wraps_scatter(hlo, o):
        f = figures.get("scatter_bytes_per_s")
        if f is not None:
            s = o.bytes_accessed / f.value
            floor = figures.get("op_floor_s")
            if s > max(o.estimated_s, floor.value if floor is not None else 0.0):
                return s, ("scatter", f"{o.bytes_accessed / 1e6:.3g} MB at {f.value / 1e9:.4g} GB/s ({f.source})")
    if o.bound_by == "hbm" and not timed and (f := figures.get("hbm_copy_bytes_per_s")) is not None and f.nominal:
        s = o.estimated_s * f.nominal / f.value
        floor = figures.get("op_floor_s")
        if floor is not None and s < floor.value:
            return floor.value, ("floor", f"the least op time, {floor.value * 1e9:.0f} ns ({floor.source})")
        return s, ("hbm", f"x{f.nominal / f.value:.2f} at {f.value / 1e9:.4g} GB/s ({f.source})")
    if o.bound_by == "compute" and not timed and o.flops > 0:
        rate = _dtype_rate(o, figures, chip)
        if rate is not None and rate[1]:
            return o.estimated_s * rate[1] / rate[0], ("mxu", f"x{rate[1] / rate[0]:.2f} ({rate[2]})")
    floor = figures.get("op_floor_s")
    if floor is not None and o.estimated_s < floor.value and (o.bytes_accessed or o.flops):
        return floor.value, ("floor", f"the least op time, {floor.value * 1e9:.0f} ns ({floor.source})")
    return o.estimated_s, None


_RULES = {
    "hbm": "HBM-bound op(s) at the measured copy bandwidth",
    "mxu": "compute-bound op(s) at the measured matmul rate of their dtype",
    "probe": "matmul(s) timed by their probes' static cycles, at the chip's time for the square matmul over its "
             "static cycles",
    "kernel": "flash attention kernel op(s) at the share of the peak they reached on the chip",
    "sort": "sort(s) at the measured time per element",
    "gather": "gather(s) at the measured gather bandwidth",
    "scatter": "scatter(s) at the measured scatter bandwidth",
    "floor": "op(s) faster than the least time an op took on the chip, raised to it",
}


def _note(rule: str, rows: list, cal) -> str:
    added = sum(s for _, s in rows)
    top = sorted(rows, key=lambda r: -abs(r[1]))[:3]
    shown = ", ".join(f"{name} {s * 1e3:+.3g} ms" for name, s in top)
    return (f"calibration ({cal.chip}, measured {cal.date}): {len(rows)} {_RULES[rule]}, {added * 1e3:+.4g} ms per step"
            f" (most: {shown})")


def flash_kernel_delta(ops, calibration, chip, head_dim: int, seq: int) -> tuple[float, str | None]:
    """(seconds to add to a compiled module of the bundled flash attention's estimate, a note) where
    its kernel ops were priced from roofline floors: each at the share of the bf16 peak it reached on
    the chip at the nearest measured head dim and sequence (the rule `calibrate_ops` applies to an
    estimate's ops). Ops the static profile timed keep their cycles."""
    added, shares = 0.0, []
    names = _flash_names(ops, calibration)
    for o in ops:
        kernel = names.get(o.name)
        timed = o.cycles_source in ("static_profile", "matmul_probe", "kernel_probe") and o.estimated_cycles
        if kernel is None or timed or o.flops <= 0:
            continue
        share = calibration.kernel_share(kernel, head_dim, seq, chip.peak_bf16_flops_per_s)
        if share is None:
            continue
        s = max(o.flops / (chip.peak_bf16_flops_per_s * share[0]), o.estimated_s)
        added += (s - o.estimated_s) * o.runs
        shares.append(f"{kernel} {share[0]:.0%}")
    if not shares:
        return 0.0, None
    return added, (f"its kernel ops at the share of the bf16 peak they reached on a {calibration.chip} "
                   f"({', '.join(shares)}; head dim {head_dim}, sequence {seq})")


def _flash_names(ops, calibration) -> dict[str, str]:
    """{op name: flash kernel} of a module compiled from the flash attention alone. A module lowered
    without debug information names its custom calls `name.N`: there the kernels are told apart by
    their FLOPs, whose order (forward < dQ < dK/dV: 4, 6 and 8 FLOPs per pair and head dim) the
    calibration's own cost estimates give."""
    named = {o.name: k for o in ops if (k := _kernel_of(o)) is not None}
    if named:
        return named
    calls = sorted((o for o in ops if o.opcode == "custom-call" and o.flops > 0), key=lambda o: o.flops)
    costs = next((m.work.get("cost_flops") for m in calibration.measurements
                  if m.group == "kernel" and m.work.get("cost_flops")), None) or {}
    order = sorted((k for k in costs if k in FLASH_KERNELS), key=lambda k: costs[k])
    if len(calls) == 1:
        return {calls[0].name: "flash_attention_fwd"}
    if order and len(calls) == len(order):
        return {o.name: k for o, k in zip(calls, order)}
    return {}
