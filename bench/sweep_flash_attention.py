"""Block sweep for the flash attention kernel at its production shape (B1 H8 S2048 D128 bf16, causal).

The forward kernel's `SPEC.block_candidates` on the first target are `tpudiag kernels tune flash_attention`
(sweep_common.tune_blocks: AOT-compiled on this CPU machine with the TPU compiler's static cycle profile,
every grid step stepped through); then the plain-JAX attention (f32 scores and softmax,
as users write it) and JAX's own Pallas flash attention at several of its block sizes (its 128 default
among them), and prints per compiled module the corrected cycles as `tpudiag kernels bench` computes them
(sweep_common.measure: the sum over ops of max(static estimated_cycles, HBM floor, compute floor)), where a
Pallas call's bytes come from its pl.CostEstimate. The chosen blocks (the module's DEFAULT_BLOCKS) are then
compiled for the other targets with XLA and JAX's best; `--noncausal` adds the non-causal forward at the
chosen blocks, and `--mode bwd|both` the training step: jax.grad of sum(out * ct) with a random bf16
cotangent passed in. JAX's kernel wants K/V at all H heads; at the MHA production shape nothing is
repeated. Never asserts.

    python bench/sweep_flash_attention.py [--targets v5e v6e] [--mode fwd|bwd|both] [--noncausal]
                                          [--static-timeout 600] [--out /tmp/sweep_flash_attention]
"""

from __future__ import annotations

import argparse
import sys

from sweep_common import Sweep, add_sweep_args, tune_blocks

# JAX's kernel: (block_q, block_k_major, block_k). 2048 blocks do not compile: its kernel keeps the
# default 16 MiB scoped VMEM ("CompileTimeScopedVmemOom: 20.47M > 16.00M" on v5e).
JAX_CANDIDATES = ((128, 128, 128), (512, 512, 512), (1024, 512, 512), (512, 1024, 1024), (1024, 1024, 512),
                  (1024, 1024, 1024))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The backward module's static profile takes minutes on a shared 2-core machine (the CLI's 60 s
    # limit would drop it and leave only the HBM floor).
    add_sweep_args(ap, static_timeout=600.0, out="/tmp/sweep_flash_attention", out_help=None)
    ap.add_argument("--mode", choices=("fwd", "bwd", "both"), default="fwd")
    ap.add_argument("--noncausal", action="store_true", help="also the non-causal forward at the chosen blocks")
    ap.add_argument("--skip-sweep", action="store_true", help="only the chosen blocks, XLA and JAX's best")
    ap.add_argument("--static-memory-gib", type=float, default=8.0,
                    help="JAX's backward needs more than 8 GiB to profile; without it only its HBM floor counts")
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as jfa

    from tpudiag.kernels import flash_attention as fa

    b, h, kvh, s, d = fa.PRODUCTION
    qs = jax.ShapeDtypeStruct((b, h, s, d), jnp.bfloat16)
    kvs = jax.ShapeDtypeStruct((b, kvh, s, d), jnp.bfloat16)
    fwd_args = (qs, kvs, kvs)
    grad_args = fwd_args + (qs,)

    def ours(bs, causal=True):
        def f(q, k, v):
            return fa.flash_attention(q, k, v, causal=causal, block_sizes=bs)
        return f

    def xla(causal=True):
        def f(q, k, v):
            return fa.xla_attention(q, k, v, causal=causal)
        return f

    def jax_kernel(blocks, causal=True):
        bq, bkm, bk = blocks
        bs = jfa.BlockSizes(block_q=bq, block_k_major=bkm, block_k=bk, block_b=1, block_q_major_dkv=bq,
                            block_k_major_dkv=bkm, block_k_dkv=bk, block_q_dkv=bq, block_k_major_dq=bkm,
                            block_k_dq=bk, block_q_dq=bq)

        def f(q, k, v):
            if kvh != h:  # JAX's kernel has no grouped heads: repeat K/V outside its call
                k, v = jnp.repeat(k, h // kvh, axis=1), jnp.repeat(v, h // kvh, axis=1)
            return jfa.flash_attention(q, k, v, causal=causal, sm_scale=1.0 / d ** 0.5, block_sizes=bs)
        return f

    def with_grad(f):
        # The cotangent comes in as an argument (random in a real step): a constant would let XLA fold it.
        def g(q, k, v, ct):
            return jax.grad(lambda q, k, v: jnp.sum((f(q, k, v) * ct).astype(jnp.float32)), argnums=(0, 1, 2))(q, k, v)
        return g

    def line(r):
        return (f"  {r['target']:4s} {r['variant']:6s} {r['label']:58s} {r['cycles'] / 1e3:9.1f}k cyc  "
                f"{r['mb']:7.1f} MB  [{r['src']}] {' '.join(r['big'][:4])}  ({r['wall_s']:.0f} s)")

    sw = Sweep(a.out, timeout_s=a.static_timeout, memory_gib=a.static_memory_gib)
    rows = sw.rows

    def measure(label, variant, fn, args, target, tag):
        r = sw(fn, args, target, f"{tag}-{target}", label=label, variant=variant)
        ok = r["status"] == "ok"
        r.update(cycles=r["corrected"] if ok else float("nan"),
                 src=r["sources"] if ok else f"module {r['status']}: {(r['error'] or '')[:120]}",
                 big=[f"{o['name']}={o['cycles'] / 1e3:.0f}k" for o in r["op_rows"]  # the kernels and big fusions
                      if o["opcode"] in ("custom-call", "fusion") and o["cycles"] >= 1000])
        print(line(r), flush=True)
        return r["cycles"]

    first, others = a.targets[0], a.targets[1:]
    modes = {"fwd": ("fwd",), "bwd": ("bwd",), "both": ("fwd", "bwd")}[a.mode]
    chosen = fa.DEFAULT_BLOCKS
    jax_best = tuple(fa.JAX_BEST[k] for k in ("block_q", "block_k_major", "block_k"))
    for mode in modes:
        wrap, args = (lambda f: f, fwd_args) if mode == "fwd" else (with_grad, grad_args)
        print(f"== {mode} ({'forward' if mode == 'fwd' else 'grad of sum(out * ct)'}) B{b} H{h} KVH{kvh} S{s} D{d} "
              f"bf16 causal", flush=True)
        base, jax_cyc, jax_src = {}, {}, {}
        for target in [first] + others:
            base[target] = measure("plain JAX (f32 scores, softmax)", "xla", wrap(xla()), args, target, f"{mode}-xla")
            if mode == "bwd":  # JAX's backward at its 128 default profiles for many minutes: best blocks only
                jax_list = (jax_best,)
            elif target == first and not a.skip_sweep:
                jax_list = JAX_CANDIDATES
            else:
                jax_list = (jax_best, (128, 128, 128))
            for jb in jax_list:
                tag = f"{mode}-jax-{'x'.join(map(str, jb))}"
                jax_cyc[(target, jb)] = measure(f"JAX flash_attention q{jb[0]} k_major{jb[1]} k{jb[2]}", "jax",
                                                wrap(jax_kernel(jb)), args, target, tag)
                jax_src[(target, jb)] = rows[-1]["src"]
            if target == first and not a.skip_sweep and mode == "fwd":  # `tpudiag kernels tune flash_attention`
                for r in tune_blocks("flash_attention", target, sw.out / f"tune-{target}", a.static_timeout):
                    rows.append(dict(r, variant="kernel", label=r["blocks"] + (" (chosen)" if r["chosen"] else ""),
                                     cycles=r["corrected"] if r["corrected"] is not None else float("nan")))
                continue
            for bs in (chosen,):
                mark = " (chosen)" if bs == chosen else ""
                measure(bs.text() + mark, "kernel", wrap(ours(bs)), args, target, f"{mode}-ours-{len(rows)}")
        print(f"-- {mode}: ratios (corrected cycles; <= 0.7x plain JAX and <= 1.0x JAX's best kernel is the goal)")
        for r in rows:
            if r["variant"] != "kernel" or r["label"].startswith("noncausal"):
                continue
            t = r["target"]
            jb = min((v, k[1]) for k, v in jax_cyc.items() if k[0] == t)
            floor_only = "" if jax_src[(t, jb[1])].find("static_profile") >= 0 else " [JAX: HBM floor only]"
            print(f"  {t:4s} {r['label']:70s} {r['cycles'] / 1e3:8.1f}k  vs plain {r['cycles'] / base[t]:5.2f}x  "
                  f"vs JAX best (q{jb[1][0]} k{jb[1][1]}/{jb[1][2]}: {jb[0] / 1e3:.1f}k) {r['cycles'] / jb[0]:5.2f}x"
                  + floor_only)
        rows.clear()
    if a.noncausal:
        print("== fwd non-causal at the chosen blocks", flush=True)
        for target in a.targets:
            x = measure("plain JAX, non-causal", "xla", xla(False), fwd_args, target, "nc-xla")
            j = measure(f"JAX flash_attention {jax_best}, non-causal", "jax", jax_kernel(jax_best, False), fwd_args,
                        target, "nc-jax")
            k = measure(f"noncausal {chosen.text()}", "kernel", ours(chosen, False), fwd_args, target, "nc-ours")
            print(f"  {target}: kernel {k / x:.2f}x plain, {k / j:.2f}x JAX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
