"""`tpudiag estimate`: a whole step at scale, from the compile report of the step's one module.

Model FLOPs follow MaxText's definition (`calculate_tflops_training_per_device`): 6 x the
parameters that are matmul weights x tokens (the lookup embedding is not a matmul; an untied LM
head is), plus attention: 12 x batch x seq^2 x query heads x head dim x layers for the forward and
backward of a non-causal attention, halved for a causal one. A decode step (`model.decode`) is a
forward pass: 2 x matmul weights x tokens, plus 4 x tokens x context x heads x head dim x layers. MFU = model FLOPs / (step time x
devices x the chip's bf16 peak). The step time is the compile report's: every op's estimate x its
runs (loop trip counts), collectives and transfers to host memory counted by their exposed time
(docs/estimate.md).

Pure: takes a `CompileReport`, what the lowering recorded, and the target; returns an
`EstimateReport`. No I/O.
"""

from __future__ import annotations

from tpudiag.analyze.hlo.vocabulary import ASYNC_COPY
from tpudiag.results.estimate import SCHEMA, EstimateReport, PeakBuffer, StepBreakdown, TopOp

_TOP = 10


def model_flops(model: dict, tokens: int) -> tuple[float, dict[str, float]] | None:
    """(model FLOPs per step, {"weights", "attention"}) from the model's dimensions; None without a
    parameter count. A program that counts its own (`model.flops`, with `flops_detail`: MaxText's
    count, which its published TFLOP/s/device use) is taken as it says."""
    if isinstance(model.get("flops"), (int, float)) and model["flops"] > 0:
        detail = model.get("flops_detail") or {}
        return float(model["flops"]), {k: float(v) for k, v in detail.items() if isinstance(v, (int, float))}
    params = model.get("params")
    if not isinstance(params, (int, float)) or params <= 0:
        return None
    matmul_params = params - float(model.get("embedding_params") or 0)
    if model.get("decode"):  # forward only, one new token per sequence against `context` cached positions
        attention = 0.0
        if all(isinstance(model.get(k), (int, float)) for k in ("layers", "context", "heads", "head_dim")):
            attention = 4.0 * tokens * model["context"] * model["heads"] * model["head_dim"] * model["layers"]
        weights = 2.0 * matmul_params * tokens
        return weights + attention, {"weights": weights, "attention": attention}
    weights = 6.0 * matmul_params * tokens
    attention = 0.0
    keys = ("layers", "seq", "heads", "head_dim")
    if all(isinstance(model.get(k), (int, float)) for k in keys):
        batch = tokens / model["seq"]
        attention = 12.0 * batch * model["seq"] ** 2 * model["heads"] * model["head_dim"] * model["layers"]
        if model.get("causal", True):
            attention /= 2
    return weights + attention, {"weights": weights, "attention": attention}


LEAVES_OUT = (
    "host overhead between steps (input pipeline, Python dispatch): the estimate is device time only",
    "collective latency: the ICI model is bandwidth only, and optimistic for small collectives",
    "the static cost model's known gaps (docs/compile.md, TPU notes): HBM-bound ops are taken at their "
    "roofline floor, fused kernels are not re-timed",
)
TIMED_HOST = ("transfers to and from host memory at the host link's rate: no latency or DMA setup, a host "
              "that moves them slower, or link time of transfers in a loop inside another transfer's window")
UNTIMED_HOST = ("transfers to and from host memory (activation offload) on a chip the table gives no host-link "
                "bandwidth for: their bytes are a finding, not timed")


def _host_link(chip: str) -> float | None:
    from tpudiag.targets import CHIPS

    return CHIPS[chip].host_link_bytes_per_s if chip in CHIPS else None


def build_estimate(compile_report, lowered: dict, *, program: str, argv: list[str], libtpu_init_args: str | None,
                   artifacts: dict[str, str], peak_buffers: tuple = (), host=None, copies=None) -> EstimateReport:
    """`peak_buffers`: `peak_buffers.peak_buffers` rows of the step's dump (the caller reads the files).
    `host`: the step's host transfers timed on the host link (`host_transfers.HostTime`), None when it
    makes none or the chip has no host-link figure; their exposed time is part of the step. `copies`:
    its asynchronous copies within the chip timed against the compute in their windows
    (`async_copies.CopyTime`); without it, the copies' total against the step's compute."""
    t = compile_report.target
    mesh = {a: int(n) for a, n in lowered.get("mesh", [])}
    tokens = int(lowered["tokens"])
    modules = [m for m in compile_report.modules if m.ops or not m.ok]
    m = modules[0] if modules else None
    flops = model_flops(lowered.get("model") or {}, tokens)
    base = dict(schema=SCHEMA, program=program, argv=tuple(argv), target=t.to_dict(), mesh=mesh,
                libtpu_init_args=libtpu_init_args or None, tokens=tokens,
                model_flops=flops[0] if flops else None, model_flops_detail=flops[1] if flops else None,
                leaves_out=LEAVES_OUT + ((TIMED_HOST,) if host is not None else () if _host_link(t.chip) else
                                        (UNTIMED_HOST,)), artifacts=artifacts,
                peak_buffers=tuple(PeakBuffer(**b) for b in peak_buffers))
    if m is None or not m.ok or m.totals is None or m.estimated_s is None:
        memory = m.memory if m is not None else {}
        findings = list(m.findings) if m is not None else []
        reason = (m.error if m is not None else None) or "the step did not compile"
        return EstimateReport(status="failed", reason=reason, step_s=None, breakdown=None, mfu=None,
                              tokens_per_s_per_device=None, peak_hbm_bytes=memory.get("peak_hbm_bytes"),
                              hbm_capacity_bytes=memory.get("hbm_capacity_bytes"), fits=memory.get("fits"),
                              top_ops=(), findings=tuple(findings), **base)
    collective_names = {c.name for c in m.collectives}
    compute = hbm = copies_s = 0.0
    for o in m.ops:
        if o.name in collective_names:
            continue
        # An asynchronous copy (vocabulary.ASYNC_COPY): on a v5e a training step's copy-starts took no
        # time of their own in the trace (tpudiag report fixtures/tpu-v5e/llama_train: 0 self time), the
        # copy ran beside the ops after them. They share HBM with the HBM-bound ops, so only compute
        # hides them: a decode step's weight prefetches are most of its time.
        if o.opcode in ASYNC_COPY:  # overlapped with compute, not with other HBM traffic
            copies_s += o.total_s
            continue
        if o.bound_by == "hbm":
            hbm += o.total_s
        else:
            compute += o.total_s  # compute, static_cycles (and ici for a collective the list does not hold)
    # the copies' time that the compute cannot hide: per window where the schedule is known
    copies_exposed = copies.exposed_s if copies is not None else max(0.0, copies_s - compute)
    hbm += copies_exposed
    exposed = sum(c.exposed_s * c.runs for c in m.collectives)
    hidden = sum((c.estimated_s - c.exposed_s) * c.runs for c in m.collectives)
    host_s = host.exposed_s if host is not None else 0.0
    step_s = compute + hbm + exposed + host_s
    devices = int(lowered.get("devices") or t.devices)  # the mesh's: one chip's for a single-chip target
    mfu = flops[0] / (step_s * devices * t.peak_bf16_flops_per_s) if flops and step_s > 0 else None
    ranked = sorted(m.ops, key=lambda o: -o.total_s)[:_TOP]
    top = tuple(TopOp(name=o.name, opcode=o.opcode, bound_by=o.bound_by, total_s=o.total_s,
                      share=o.total_s / step_s if step_s else 0.0, runs=o.runs, source=o.source, limit=o.limit)
                for o in ranked)
    memory = m.memory
    findings = list(m.findings)
    if copies is not None:
        findings.append(f"asynchronous copies (copy-start/copy-done, {copies.copy_s * 1e3:.3g} ms at HBM bandwidth) "
                        f"run beside the compute scheduled between each start and done; "
                        f"{copies_exposed * 1e3:.3g} ms of them it does not cover, counted as exposed HBM time")
    elif copies_s:
        findings.append(f"asynchronous copies (copy-start/copy-done, {copies_s * 1e3:.3g} ms at HBM bandwidth) overlap "
                        f"the step's compute ({compute * 1e3:.3g} ms), as a v5e ran them; "
                        f"{copies_exposed * 1e3:.3g} ms of them counted as exposed HBM time")
    if not memory.get("fits", True):
        findings.insert(0, f"does not fit: {memory['peak_hbm_bytes'] / 2**30:.1f} GiB of HBM per device against "
                           f"{memory['hbm_capacity_bytes'] / 2**30:.1f} GiB")
    return EstimateReport(status="ok", reason=None, step_s=step_s,
                          breakdown=StepBreakdown(compute_s=compute, hbm_s=hbm, collective_s=exposed,
                                              hidden_collective_s=hidden, host_s=host_s,
                                              hidden_host_s=host.hidden_s if host is not None else 0.0),
                          mfu=mfu, tokens_per_s_per_device=tokens / step_s / devices if step_s > 0 else None,
                          peak_hbm_bytes=memory.get("peak_hbm_bytes"),
                          hbm_capacity_bytes=memory.get("hbm_capacity_bytes"), fits=memory.get("fits"),
                          top_ops=top, findings=tuple(findings), **base)
