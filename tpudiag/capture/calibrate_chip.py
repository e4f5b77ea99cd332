"""The microbenchmarks of `tpudiag calibrate`, run on the attached TPU by a worker process that holds
the chip alone (`python -m tpudiag.capture.calibrate_chip REQUEST.json RESULTS.jsonl`).

Each benchmark is a small jitted program of one kind of work the static model prices from the chip's
data sheet: HBM reads, writes and copies at several sizes, the smallest op, matmuls in bf16, int8
and fp8 (square, and with a narrow contraction or output), sort and top-k, gather and scatter, a
Pallas kernel's grid steps and its DMAs, the bundled flash attention kernels at head dims 64 and
128, and host transfers. Device programs are timed by their module's span in a profiler trace (min
and median of `calls`); the per-op times of the flash kernels come from the same trace's op line
with the op's own cost estimate. Host transfers are timed by the wall clock.

Writes a first line `{"device": KIND, "jax": VERSION}` and then one line per measurement
(`results/calibration.py` reads them). Exit 3: no TPU backend (the reason on stderr, one line).
Reads nothing but its request; derives nothing (the figures are derived from these rows).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tpudiag.errors import one_line
from tpudiag.capture.chip_bench import named

MIB = 1 << 20


def _pallas_steps(steps: int):
    """A kernel that does almost nothing per grid step: one (8, 128) f32 block in, +1, out."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(steps,),
                              in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)

    return f, (jax.ShapeDtypeStruct((8 * steps, 128), jnp.float32),)


def _pallas_dmas(pages: int, page_rows: int, in_flight: int):
    """A kernel that copies `pages` pages of [page_rows, 128] f32 from HBM into a VMEM ring of
    `in_flight` slots, `in_flight` DMAs started and then waited at a time (one grid step)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(src_ref, o_ref, buf, sem):
        def group(g, acc):
            copies = [pltpu.make_async_copy(src_ref.at[g * in_flight + s], buf.at[s], sem.at[s])
                      for s in range(in_flight)]
            for c in copies:
                c.start()
            for c in copies:
                c.wait()
            return acc + buf[0]

        o_ref[...] = jax.lax.fori_loop(0, pages // in_flight, group, jnp.zeros((page_rows, 128), jnp.float32))

    def f(src):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((page_rows, 128), jnp.float32),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((page_rows, 128), lambda: (0, 0)),
                              scratch_shapes=[pltpu.VMEM((in_flight, page_rows, 128), jnp.float32),
                                              pltpu.SemaphoreType.DMA((in_flight,))])(src)

    return f, (jax.ShapeDtypeStruct((pages, page_rows, 128), jnp.float32),)


def programs() -> list[dict]:
    """Every device benchmark: name, group, the function, its ShapeDtypeStructs and the work one call
    does (bytes moved, flops or elements), which the rate divides by."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    sds = jax.ShapeDtypeStruct
    out = []

    def add(name, group, fn, args, what, **work):
        out.append({"name": name, "group": group, "fn": fn, "args": args, "what": what, **work})

    for mib in (4, 64, 512):
        n = mib * MIB // 4
        add(f"hbm_copy_{mib}mib", "hbm", lambda x: x + 1.0, (sds((n // 1024, 1024), jnp.float32),),
            f"x + 1 over f32[{n // 1024},1024] ({mib} MiB read, {mib} MiB written)", bytes=2 * mib * MIB)
        add(f"hbm_read_{mib}mib", "hbm", lambda x: jnp.sum(x, axis=0), (sds((n // 1024, 1024), jnp.float32),),
            f"column sums of f32[{n // 1024},1024] ({mib} MiB read)", bytes=mib * MIB)
        add(f"hbm_write_{mib}mib", "hbm", lambda s, n=n: jnp.broadcast_to(s, (n // 1024, 1024)) * 2.0,
            (sds((1, 1024), jnp.float32),), f"a row broadcast to f32[{n // 1024},1024] ({mib} MiB written)",
            bytes=mib * MIB)
    add("op_smallest", "hbm", lambda x: x + 1.0, (sds((8, 128), jnp.float32),),
        "x + 1 over f32[8,128] (4 KiB): the least time an op takes", bytes=8192)

    def mm(m, k, n, dt, acc):
        return (lambda a, b: lax.dot(a, b, preferred_element_type=acc)), (sds((m, k), dt), sds((k, n), dt))

    # Square: the MXU's sustained rate. A narrow contraction or output (a head dim of 64) is not
    # measured by a plain matmul: XLA writes or reads its [M, N] side in HBM, which bounds it first;
    # the flash kernels below measure head dims 64 and 128 with their scores in VMEM.
    fn, args = mm(4096, 4096, 4096, jnp.bfloat16, jnp.float32)
    add("mxu_bf16_square", "mxu", fn, args, "bf16[4096,4096] @ bf16[4096,4096], f32 out", flops=2 * 4096 ** 3)
    fn, args = mm(4096, 4096, 4096, jnp.int8, jnp.int32)
    add("mxu_int8_square", "mxu", fn, args, "int8[4096,4096] @ int8[4096,4096], int32 out", flops=2 * 4096 ** 3)
    fn, args = mm(4096, 4096, 4096, jnp.float8_e4m3fn, jnp.float32)
    add("mxu_fp8_square", "mxu", fn, args, "f8e4m3[4096,4096] @ f8e4m3[4096,4096], f32 out", flops=2 * 4096 ** 3)

    rows, vocab = 64, 131072
    add("sort_f32", "sort", lambda x: jnp.sort(x, axis=-1), (sds((rows, vocab), jnp.float32),),
        f"sort f32[{rows},{vocab}] along its rows", elements=rows * vocab)
    add("top_k_64", "sort", lambda x: lax.top_k(x, 64), (sds((rows, vocab), jnp.float32),),
        f"top_k(k=64) of f32[{rows},{vocab}]", elements=rows * vocab)

    # A table of 128 MiB (beyond VMEM) read or updated at random rows; the scatter's row count
    # includes the copy of the table XLA makes (its operand is not donated).
    table, dim, picks = 65536, 1024, 65536
    add("gather_rows", "gather", lambda t, i: jnp.take(t, i, axis=0),
        (sds((table, dim), jnp.bfloat16), sds((picks,), jnp.int32)),
        f"{picks} rows of bf16[{table},{dim}] by index", bytes=2 * picks * dim * 2)
    add("scatter_add_rows", "gather", lambda t, i, u: t.at[i].add(u),
        (sds((table, dim), jnp.bfloat16), sds((picks,), jnp.int32), sds((picks, dim), jnp.bfloat16)),
        f"{picks} rows added into bf16[{table},{dim}] by index (with the table's copy)",
        bytes=2 * table * dim * 2 + 3 * picks * dim * 2)

    steps = 4096
    fn, args = _pallas_steps(steps)
    add("pallas_grid_steps", "pallas", fn, args, f"a Pallas kernel of {steps} grid steps of one (8,128) f32 block",
        steps=steps)
    for page_rows in (8, 32):
        pages = 8192
        fn, args = _pallas_dmas(pages, page_rows, 16)
        add(f"pallas_dma_{page_rows * 512 // 1024}kib", "pallas", fn, args,
            f"{pages} DMAs of {page_rows * 512 // 1024} KiB each, 16 in flight", dmas=pages,
            bytes=pages * page_rows * 512)
    out.extend(_flash_programs())
    return out


def _flash_programs() -> list[dict]:
    """The bundled flash attention kernels, forward and backward (one program: the gradient of a
    causal attention), at head dims 64 and 128 and sequences of 1024 to 8192: each kernel
    op's time against its own cost estimate. Batch 2 and 8 heads: a shape of its own, not a step's."""
    import jax
    import jax.numpy as jnp

    from tpudiag.kernels.flash_attention import flash_attention
    from tpudiag.kernels.flash_attention_bwd import pair_count

    def train(q, k, v):
        return jax.grad(lambda q, k, v: jnp.sum(flash_attention(q, k, v, causal=True).astype(jnp.float32)),
                        argnums=(0, 1, 2))(q, k, v)

    out = []
    for d in (64, 128):
        for s in (1024, 2048, 4096, 8192):
            b, h = 2, 8
            args = tuple(jax.ShapeDtypeStruct((b, h, s, d), jnp.bfloat16) for _ in range(3))
            pairs = pair_count(s, s, True) * b * h  # the kernels' own cost estimates count these
            cost = {"flash_attention_fwd": 4 * pairs * d, "flash_attention_dq": 6 * pairs * d,
                    "flash_attention_dkv": 8 * pairs * d}
            out.append({"name": f"flash_d{d}_s{s}", "group": "kernel", "fn": train, "args": args, "ops": True,
                        "head_dim": d, "seq": s, "cost_flops": cost,
                        "what": f"flash_attention causal, q/k/v bf16[{b},{h},{s},{d}], forward and backward"})
    return out


def _inputs(args, key):
    import jax
    import jax.numpy as jnp

    out = []
    for i, a in enumerate(args):
        k = jax.random.fold_in(key, i)
        if jnp.issubdtype(a.dtype, jnp.integer) and a.ndim == 1:  # row indices: in range of the table
            out.append(jax.random.randint(k, a.shape, 0, 65536, jnp.int32))
        elif jnp.issubdtype(a.dtype, jnp.integer):
            out.append(jax.random.randint(k, a.shape, -100, 100, jnp.int32).astype(a.dtype))
        else:
            out.append((jax.random.normal(k, a.shape, jnp.float32) * 0.5).astype(a.dtype))
    return tuple(out)


def _trace_times(trace_dir: Path, wanted: dict[str, dict]) -> tuple[dict[str, list[int]], dict[str, list[dict]]]:
    """(module -> its runs' device ns, module -> its ops' [{op, runs_ns, flops}]) from the newest trace."""
    from tpudiag.parse.device_planes import read_device_planes

    paths = sorted(trace_dir.rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    planes = read_device_planes(paths[-1], paths[-1].read_bytes()) if paths else None
    if planes is None:
        return {}, {}
    runs = planes.module_runs
    spans = {m: runs.loc[runs["module"] == m, "duration_ns"].astype(int).tolist() for m in wanted}
    ops_of = {}
    meta = planes.op_meta
    for module, item in wanted.items():
        if not item.get("ops"):
            continue
        rows = planes.ops[planes.ops["module"] == module]
        found = []
        for (pid, op), g in rows.groupby(["program_id", "op"]):
            m = meta[(meta["program_id"] == pid) & (meta["op"] == op)]
            found.append({"op": op, "runs_ns": g["duration_ns"].astype(int).tolist(),
                          "flops": int(m["flops"].iloc[0]) if len(m) else 0})
        ops_of[module] = found
    return spans, ops_of


def time_programs(items: list[dict], calls: int, emit) -> None:
    """Time each device benchmark of `items` on the chip in one trace; `emit` a row each."""
    import jax

    ready = []
    for it in items:
        row = {k: v for k, v in it.items() if k not in ("fn", "args", "ops")}
        try:
            sets = [_inputs(it["args"], jax.random.key(r)) for r in range(2)]
            name = f"tpudiag_cal_{it['name']}"
            jf = jax.jit(named(it["fn"], name))
            for s in sets:
                jax.block_until_ready(jf(*s))
            ready.append((it, row, jf, sets, "jit_" + name))
        except Exception as e:
            emit({**row, "status": "failed", "error": one_line(e, 400)})
    with tempfile.TemporaryDirectory(prefix="tpudiag-calibrate-") as tmp:
        jax.profiler.start_trace(tmp)
        try:
            for _, _, jf, sets, _ in ready:
                jax.block_until_ready([jf(*sets[c % 2]) for c in range(calls)])
        finally:
            jax.profiler.stop_trace()
        spans, ops = _trace_times(Path(tmp), {m: it for it, _, _, _, m in ready})
    for it, row, _, _, module in ready:
        runs = spans.get(module) or []
        if not runs:
            emit({**row, "status": "failed", "error": f"the trace holds no run of {module}"})
            continue
        us = [d / 1e3 for d in runs]
        out = {**row, "status": "ok", "runs": len(us), "min_us": round(min(us), 3),
               "median_us": round(statistics.median(us), 3)}
        if it.get("ops"):
            out["ops"] = [{"op": o["op"], "flops": o["flops"], "min_us": round(min(o["runs_ns"]) / 1e3, 3),
                           "median_us": round(statistics.median(o["runs_ns"]) / 1e3, 3)}
                          for o in ops.get(module, []) if o["runs_ns"]]
        emit(out)


def time_host(emit, mib: int = 256, calls: int = 5) -> None:
    """Transfers between HBM and host memory of `mib` MiB, by the wall clock: the runtime's
    `device_put` of a numpy array and `np.asarray` of a device array (what a program's input feed and
    its fetches pay), and device_put between the device's memory and its pinned host memory (the DMA
    that activation offload uses)."""
    import jax
    import numpy as np

    host = np.ones((mib * MIB // 4,), np.float32)
    dev0 = jax.devices()[0]

    def memory(kind):
        return jax.sharding.SingleDeviceSharding(dev0, memory_kind=kind)

    cases = (("host_to_device", f"device_put of a numpy array of {mib} MiB"),
             ("device_to_host", f"np.asarray of a device array of {mib} MiB"),
             ("hbm_to_pinned_host", f"device_put of {mib} MiB from device memory to pinned host memory"),
             ("pinned_host_to_hbm", f"device_put of {mib} MiB from pinned host memory to device memory"))
    for name, what in cases:
        times = []
        try:
            dev = jax.block_until_ready(jax.device_put(host))
            pinned = jax.block_until_ready(jax.device_put(dev, memory("pinned_host"))) if "pinned" in name else None
            for _ in range(calls + 1):
                dev = jax.block_until_ready(dev + 1.0)  # a fresh buffer: nothing cached on the host
                t = time.perf_counter()
                if name == "host_to_device":
                    jax.block_until_ready(jax.device_put(host))
                elif name == "device_to_host":
                    np.asarray(dev)
                elif name == "hbm_to_pinned_host":
                    jax.block_until_ready(jax.device_put(dev, memory("pinned_host")))
                else:
                    jax.block_until_ready(jax.device_put(pinned, memory("device")))
                times.append(time.perf_counter() - t)
        except Exception as e:
            emit({"name": name, "group": "host", "what": what, "status": "failed", "error": one_line(e, 400)})
            continue
        us = [t * 1e6 for t in times[1:]]
        emit({"name": name, "group": "host", "what": what, "bytes": mib * MIB, "status": "ok", "runs": len(us),
              "min_us": round(min(us), 1), "median_us": round(statistics.median(us), 1), "clock": "wall"})


def main(argv: list[str]) -> int:
    from tpudiag.capture.chip_bench import EXIT_NO_TPU, start_worker

    started = start_worker(argv)
    if started is None:
        return EXIT_NO_TPU
    request, out, devices = started
    import jax

    only = set(request.get("only") or ())
    with out.open("a") as f:
        def emit(row):
            f.write(json.dumps(row) + "\n")
            f.flush()

        emit({"device": devices[0].device_kind, "jax": jax.__version__})
        items = [p for p in programs() if not only or p["name"] in only or p["group"] in only]
        time_programs(items, request["calls"], emit)
        if not only or "host" in only:
            time_host(emit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
