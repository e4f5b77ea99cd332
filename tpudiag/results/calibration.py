"""A chip's measured calibration (schema tpudiag.calibration/1): what `tpudiag calibrate` timed on a
TPU (capture/calibrate_chip.py), and the figures derived from it that `estimate` and `plan` use in
place of the data sheet's.

`Calibration.figures()` derives each figure from one named measurement, so a report can say where a
correction came from: HBM copy, read and write bandwidth (the largest size measured), the least time
an op takes, the MXU rates (bf16 square and with a narrow contraction or output, int8, fp8), sort
and top-k per element, gather and scatter bandwidth, a Pallas grid step and a DMA, the host link,
and each bundled kernel's share of the bf16 peak at the head dims measured. Nothing here is fitted
to a step it is later judged on. Reads no file (api/calibrate.py reads tables and files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA = "tpudiag.calibration/1"


@dataclass(frozen=True)
class OpTime:
    """One op of a measured program, from the trace's op line: its fastest and median run."""

    op: str
    flops: int
    min_us: float
    median_us: float


@dataclass(frozen=True)
class Measurement:
    """One microbenchmark: what it ran, the work one call does, and its device (or wall) time."""

    name: str
    group: str  # hbm, mxu, sort, gather, pallas, kernel, host
    what: str
    status: str  # ok | failed
    min_us: float | None = None
    median_us: float | None = None
    runs: int = 0
    work: dict = field(default_factory=dict)  # bytes, flops, elements, steps, dmas, head_dim, cost_flops
    ops: tuple[OpTime, ...] = ()
    clock: str = "device"  # device: the module's span in the trace; wall: the host's clock
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.status != "ok" or not self.min_us else self.min_us / 1e6

    def rate(self, key: str) -> float | None:
        """Work `key` per second at the fastest call."""
        s, w = self.seconds, self.work.get(key)
        return None if s is None or not w else w / s

    def to_dict(self) -> dict:
        d = {"name": self.name, "group": self.group, "what": self.what, "status": self.status,
             "min_us": self.min_us, "median_us": self.median_us, "runs": self.runs, "work": dict(self.work),
             "clock": self.clock}
        if self.ops:
            d["ops"] = [vars(o) for o in self.ops]
        if self.error:
            d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        return cls(name=d["name"], group=d["group"], what=d["what"], status=d["status"], min_us=d.get("min_us"),
                   median_us=d.get("median_us"), runs=int(d.get("runs") or 0), work=dict(d.get("work") or {}),
                   ops=tuple(OpTime(**o) for o in d.get("ops") or ()), clock=d.get("clock", "device"),
                   error=d.get("error"))


_WORK_KEYS = ("bytes", "flops", "elements", "steps", "dmas", "head_dim", "seq", "cost_flops", "static_cycles")


def measurement_of_row(row: dict) -> Measurement:
    """A worker's JSON line as a Measurement."""
    ops = tuple(OpTime(op=o["op"], flops=int(o.get("flops") or 0), min_us=o["min_us"], median_us=o["median_us"])
                for o in row.get("ops") or ())
    return Measurement(name=row["name"], group=row["group"], what=row.get("what", ""), status=row["status"],
                       min_us=row.get("min_us"), median_us=row.get("median_us"), runs=int(row.get("runs") or 0),
                       work={k: row[k] for k in _WORK_KEYS if k in row}, ops=ops, clock=row.get("clock", "device"),
                       error=row.get("error"))


@dataclass(frozen=True)
class Figure:
    """A derived figure, its unit, and the measurement it comes from."""

    name: str
    value: float
    unit: str
    source: str  # the measurement's name
    nominal: float | None = None  # the data sheet's figure, where it has one

    @property
    def ratio(self) -> float | None:
        return None if not self.nominal else self.value / self.nominal


@dataclass(frozen=True)
class Calibration:
    chip: str  # v5e
    device: str  # the device's own name, "TPU v5 lite"
    jax: str
    date: str
    command: str
    measurements: tuple[Measurement, ...]
    schema: str = SCHEMA

    def measurement(self, name: str) -> Measurement | None:
        return next((m for m in self.measurements if m.name == name and m.status == "ok"), None)

    def figures(self, chip=None) -> dict[str, Figure]:
        """{name: Figure} derived from the measurements; `chip` (targets.Chip) adds the nominal figures."""
        nominal_bw = chip.hbm_bytes_per_s if chip is not None else None
        nominal_bf16 = chip.peak_bf16_flops_per_s if chip is not None else None
        out: dict[str, Figure] = {}

        def put(name, source, key, unit, nominal=None, invert=False):
            m = self.measurement(source)
            r = m.rate(key) if m is not None else None
            if r:
                out[name] = Figure(name, 1.0 / r if invert else r, unit, source, nominal)

        largest = max((m.work.get("bytes", 0) for m in self.measurements if m.name.startswith("hbm_copy_")),
                      default=0) // 2 >> 20
        for kind in ("copy", "read", "write"):
            put(f"hbm_{kind}_bytes_per_s", f"hbm_{kind}_{largest}mib", "bytes", "B/s", nominal_bw)
        m = self.measurement("op_smallest")
        if m is not None:
            out["op_floor_s"] = Figure("op_floor_s", m.seconds, "s", "op_smallest")
        put("mxu_bf16_flops_per_s", "mxu_bf16_square", "flops", "FLOP/s", nominal_bf16)
        m = self.measurement("mxu_bf16_square")
        static = m.work.get("static_cycles") if m is not None else None
        if static and chip is not None:  # the chip's time for the matmul over the compiler's static cycles
            out["mxu_bf16_static_ratio"] = Figure("mxu_bf16_static_ratio", m.seconds / (static / chip.clock_hz),
                                                  "x static", "mxu_bf16_square")
        put("mxu_int8_ops_per_s", "mxu_int8_square", "flops", "OP/s",
            chip.peak_int8_ops_per_s if chip is not None else None)
        put("mxu_fp8_flops_per_s", "mxu_fp8_square", "flops", "FLOP/s",
            chip.peak_fp8_flops_per_s if chip is not None else None)
        put("sort_s_per_element", "sort_f32", "elements", "s", invert=True)
        put("top_k_s_per_element", "top_k_64", "elements", "s", invert=True)
        put("gather_bytes_per_s", "gather_rows", "bytes", "B/s", nominal_bw)
        put("scatter_bytes_per_s", "scatter_add_rows", "bytes", "B/s", nominal_bw)
        put("pallas_step_s", "pallas_grid_steps", "steps", "s", invert=True)
        put("pallas_dma_4kib_s", "pallas_dma_4kib", "dmas", "s", invert=True)
        put("pallas_dma_16kib_s", "pallas_dma_16kib", "dmas", "s", invert=True)
        link = chip.host_link_bytes_per_s if chip is not None else None
        put("host_to_device_bytes_per_s", "host_to_device", "bytes", "B/s", link)
        put("device_to_host_bytes_per_s", "device_to_host", "bytes", "B/s", link)
        put("hbm_to_pinned_host_bytes_per_s", "hbm_to_pinned_host", "bytes", "B/s", link)
        put("pinned_host_to_hbm_bytes_per_s", "pinned_host_to_hbm", "bytes", "B/s", link)
        if nominal_bf16:
            for (kernel, d, seq), eff in sorted(self.kernel_shares(nominal_bf16).items()):
                name = f"kernel:{kernel}@d{d}@s{seq}"
                out[name] = Figure(name, eff[0], "of bf16 peak", eff[1])
        return out

    def kernel_shares(self, peak_flops_per_s: float) -> dict[tuple[str, int, int], tuple[float, str]]:
        """{(kernel op, head dim, seq): (share of `peak_flops_per_s` its cost estimate's FLOPs ran at,
        the measurement)} for each bundled kernel op timed (its fastest run)."""
        out: dict[tuple[str, int, int], tuple[float, str]] = {}
        for m in self.measurements:
            if m.group != "kernel" or m.status != "ok":
                continue
            d, seq, cost = m.work.get("head_dim"), m.work.get("seq") or 0, m.work.get("cost_flops") or {}
            for o in m.ops:
                kernel = next((k for k in cost if o.op == k or o.op.startswith(k + ".")), None)
                flops = o.flops or (cost.get(kernel) if kernel else 0)
                if kernel is None or not flops or not o.min_us:
                    continue
                key = (kernel, int(d), int(seq))
                share = flops / peak_flops_per_s / (o.min_us / 1e6)
                if key not in out or share > out[key][0]:
                    out[key] = (share, m.name)
        return out

    def kernel_share(self, kernel: str, head_dim: int, seq: int, peak_flops_per_s: float
                     ) -> tuple[float, str] | None:
        """The measured share of the peak for `kernel` at the measured head dim nearest `head_dim`,
        then the measured sequence nearest `seq` (by ratio)."""
        import math

        shares = {(d, s): v for (k, d, s), v in self.kernel_shares(peak_flops_per_s).items() if k == kernel}
        if not shares:
            return None
        near_d = min({d for d, _ in shares}, key=lambda d: (abs(d - head_dim), d))
        near = min((s for d, s in shares if d == near_d),
                   key=lambda s: (abs(math.log2(max(s, 1)) - math.log2(max(seq, 1))), s))
        return shares[near_d, near]

    def to_dict(self) -> dict:
        return {"schema": self.schema, "chip": self.chip, "device": self.device, "jax": self.jax, "date": self.date,
                "command": self.command, "measurements": [m.to_dict() for m in self.measurements]}

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        """The document as a Calibration; a ValueError says what is wrong with it."""
        if not isinstance(d, dict) or not str(d.get("schema", "")).startswith("tpudiag.calibration/"):
            raise ValueError("not a tpudiag calibration (schema tpudiag.calibration/1)")
        try:
            return cls(chip=d["chip"], device=d["device"], jax=d["jax"], date=d["date"], command=d["command"],
                       measurements=tuple(Measurement.from_dict(m) for m in d["measurements"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a malformed calibration ({type(e).__name__}: {e})") from None
