"""What one block of attention takes beside its matmuls: the TPU compiler's static cycles per block of
a plain flash-attention forward (scores, softmax, PV), against the same kernel with the softmax left
out, against its two matmuls at the MXU peak.

`tpudiag estimate` counts a splash kernel's MXU work at the peak (docs/estimate.md): a floor. The
kernel also computes each block's softmax (exp, max and sum over B x B f32 scores) on the VPU and
EUP, and moves the scores through VMEM. This measures how far above the floor one block is as the
compiler schedules it, on a kernel whose every grid step runs (no mask-dependent branch, which the
static profile does not follow): a Pallas kernel whose grid is S independent blocks, S = 2 and 4,
with the static profile (loops stepped through); the per-block figure is the difference over the
two extra blocks, so the first block's unoverlapped DMA is left out.

    python bench/attention_block.py --target v6e [--block 2048] [--out DIR]

The kernel is this file's `step` (a `tpudiag estimate` FUNC); nothing is fitted and nothing asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HEAD_DIM = 128


def step(argv, mesh):
    """`tpudiag estimate` FUNC: each device runs S independent blocks of B x B scores (`--part mm`:
    the two matmuls only; `both`: with the softmax)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("mm", "both"), default="both")
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args(argv)
    b, d, s = a.block, HEAD_DIM, a.steps

    def kernel(q_ref, k_ref, v_ref, o_ref):
        scores = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)
        if a.part == "mm":
            o_ref[...] = jnp.dot(scores.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
            return
        p = jnp.exp(scores - scores.max(axis=1, keepdims=True))
        o_ref[...] = jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32) / p.sum(
            axis=1, keepdims=True)

    spec = pl.BlockSpec((None, b, d), lambda i: (i, 0, 0))
    call = pl.pallas_call(kernel, grid=(s,), in_specs=[spec] * 3, out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((s, b, d), jnp.float32))
    axis = mesh.axis_names[0]
    n = mesh.devices.size
    f = jax.shard_map(lambda q, k, v: jax.vmap(call)(q, k, v), mesh=mesh, in_specs=(P(axis),) * 3,
                      out_specs=P(axis), check_vma=False)
    sh = NamedSharding(mesh, P(axis))
    args = [jax.ShapeDtypeStruct((n, s, b, d), jnp.bfloat16, sharding=sh) for _ in range(3)]
    return {"step": jax.jit(f, in_shardings=(sh,) * 3, out_shardings=sh), "args": args, "tokens": n * s * b,
            "model": {"flops": n * s * 4 * b * b * d}}


def _cycles(target: str, part: str, block: int, steps: int, out: Path) -> tuple[int, float]:
    """(the kernel's static cycles, the chip's MXU FLOPs per cycle) from one estimate run."""
    run = out / f"{part}-{steps}"
    cmd = [sys.executable, "-m", "tpudiag", "estimate", f"{Path(__file__).resolve()}:step", "--target", target,
           "--static-profile", "--json", "--out", str(run), "--", "--part", part, "--block", str(block),
           "--steps", str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if res.returncode:
        said = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"attention_block: {target}, block {block}, {part}, {steps} blocks: {said}")
    report = json.loads((run / "report.json").read_text())
    (kernel,) = [o for o in report["modules"][0]["ops"] if o["opcode"] == "custom-call"]
    t = report["target"]
    if kernel.get("cycles_source") != "static_profile":
        raise SystemExit(f"attention_block: {target}: the static profile gave the kernel no cycles")
    return int(kernel["estimated_cycles"]), t["peak_bf16_flops_per_s"] / t["clock_hz"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="v6e")
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    a = ap.parse_args()
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="attention-block-"))
    floor = None
    rows = []
    for part, what in (("mm", "the two matmuls (scores cast to bf16, no softmax)"),
                       ("both", "scores, softmax, PV (a flash-attention block)")):
        (two, per_cycle), (four, _) = (_cycles(a.target, part, a.block, s, out) for s in (2, 4))
        per_block = (four - two) / 2
        floor = 2 * 2 * a.block * a.block * HEAD_DIM / per_cycle
        rows.append((what, two, four, per_block))
    print(f"{a.target}: one block of {a.block} x {a.block} scores, head dim {HEAD_DIM}; its two matmuls at the "
          f"MXU peak: {floor:,.0f} cycles")
    print(f"{'kernel':52} {'2 blocks':>9} {'4 blocks':>9} {'per block':>10} {'vs MXU peak':>12}")
    for what, two, four, per_block in rows:
        print(f"{what:52} {two:>9,} {four:>9,} {per_block:>10,.0f} {per_block / floor:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
