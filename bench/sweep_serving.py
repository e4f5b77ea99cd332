"""The serving kernels at real models' shapes: decode batches of 1-256, prefill chunks of 512-8192 tokens.

`tpudiag kernels bench` measures each kernel at one production shape. This runs the same bench (its
lowering, compiles, corrected cycles and floors) at a grid of shapes from published models, one
`kernels bench` run a family, each row against XLA's lowering of the reference and, where there is
one, JAX's own kernel:

    rpa     ragged_paged_attention: Llama 3 8B (32 query heads, 8 KV, D128, pages of 128) decode
            batches 1, 8, 64, 256 at context 2048, one prefill chunk of 512, 2048, 8192 tokens, and
            the production mixed step; Llama 3 70B at tensor parallelism 8 (8 query heads, 1 KV head
            a chip) at decode 64, 256 and a 2048-token chunk; every point at the mixed step's blocks
            (q blocks of 128 computed 16 tokens at a time)
    rpa-blocks  the same points at the blocks for their kind of batch, which the kernel's defaults
            pick from the shapes (`default_blocks`): a decode-only batch in q blocks of 16 tokens
            (128 pads one token to 128 rows), a prefill chunk in q blocks of 256 computed 128 at a
            time (each q block reads the pages before it again, so small blocks make a long chunk
            HBM-bound; 512 runs the static-profile compile out of VMEM with 8 KV heads); the mixed
            step is not repeated
    mla     mla_decode: DeepSeek V3 (128 heads, latent 512 + RoPE 64, pages of 16) at batch 1, 8, 32,
            128 and context 2048, and batch 32 at context 8192
    matmul  w8a8_matmul, int4_matmul, fp8_matmul (the chip's mode): Llama 3 8B's up projection
            (K4096 N14336) at M 1, 16, 64, 256, 512, 2048, 8192; Llama 3 70B's at tensor
            parallelism 8 (K8192 N3584 a chip) at M 64 and 2048
    matmul-blocks  the prefill rows (M 2048, 8192) again in M blocks of 512: with the default 256
            the weights are read once per M block, 32 times at M 8192
    moe     fused_moe: Qwen3-30B-A3B (D2048 F768, 128 experts, top 8) at 64, 256, 2048, 8192 tokens;
            Qwen3-235B-A22B (D4096 F1536, 128 experts, top 8) at 256 and 2048 tokens

DeepSeek V3's MoE (256 experts of D7168 F2048: 22.5 GB of bf16 weights) is not in the grid: it is
served with its experts sharded over chips, and `fused_moe` is a one-chip kernel.

    python bench/sweep_serving.py --target v6e [--families rpa mla matmul moe] [--out DIR]
    python bench/sweep_serving.py --summary DIR [DIR ...]    (one table of earlier runs' rows)
    python bench/sweep_serving.py --target v5e --families matmul --rows int4.   (some rows only)

Prints one Markdown table a family (`tpudiag kernels bench`'s, with a row a shape) and where its
run directory is. One bad target is one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

FAMILIES = ("rpa", "rpa-blocks", "mla", "matmul", "matmul-blocks", "moe")

LLAMA_70B_TP8 = {"q_heads": 8, "kv_heads": 1}  # 64 query and 8 KV heads over 8 chips
MATMULS = {"8b": {}, "70b-tp8": {"k": 8192, "n": 3584}}  # the up projection; 70B's N 28672 / 8
QWEN3_235B = {"d": 4096, "f": 1536, "e": 128, "top_k": 8}


def _spec(spec, name: str, make):
    """spec benched by make(blocks, chip) under `name`."""
    return dataclasses.replace(spec, name=name, bench=make, chip_bench=True)


def rpa_points() -> list[tuple[str, dict]]:
    pts = [(f"8b-decode-b{b}", {"seqs": b, "prefill": 1, "tokens": b}) for b in (1, 8, 64, 256)]
    pts += [(f"8b-prefill-{c}", {"seqs": 1, "prefill": c, "tokens": c, "context": c}) for c in (512, 2048, 8192)]
    pts.append(("8b-mixed-512+63", {}))
    pts += [(f"70b-tp8-decode-b{b}", {**LLAMA_70B_TP8, "seqs": b, "prefill": 1, "tokens": b}) for b in (64, 256)]
    pts.append(("70b-tp8-prefill-2048", {**LLAMA_70B_TP8, "seqs": 1, "prefill": 2048, "tokens": 2048,
                                         "context": 2048}))
    return pts


def blocks_for(shape: dict):
    """The RPA blocks for a point's kind of batch, pinned (None: a mixed step's): the kernel's own
    DECODE_BLOCKS and PREFILL_BLOCKS, which its defaults pick from the batch's shapes."""
    from tpudiag.kernels import ragged_paged_attention as rpa

    if shape.get("prefill") == 1:
        return rpa.DECODE_BLOCKS
    return rpa.PREFILL_BLOCKS if shape.get("seqs") == 1 else None


def specs(family: str) -> list:
    from tpudiag.kernels import (fp8_matmul, fused_moe, int4_matmul, mla_decode, ragged_paged_attention,
                                 w8a8_matmul)

    out = []
    if family == "rpa":
        for name, shape in rpa_points():
            out.append(_spec(ragged_paged_attention.SPEC, f"rpa.{name}",
                             lambda blocks=None, chip=None, shape=shape: ragged_paged_attention.bench(
                                 blocks or ragged_paged_attention.DEFAULT_BLOCKS, shape)))
    elif family == "rpa-blocks":
        for name, shape in rpa_points():
            if blocks_for(shape) is None:
                continue
            blocks = blocks_for(shape)
            out.append(_spec(ragged_paged_attention.SPEC, f"rpa.{name}.q{blocks.q_block}",
                             lambda _=None, chip=None, shape=shape, blocks=blocks:
                             ragged_paged_attention.bench(blocks, shape)))
    elif family == "mla":
        pts = [(f"b{b}-ctx2048", {"batch": b}) for b in (1, 8, 32, 128)] + [("b32-ctx8192", {"context": 8192})]
        for name, shape in pts:
            out.append(_spec(mla_decode.SPEC, f"mla.{name}",
                             lambda blocks=None, chip=None, shape=shape: mla_decode.bench(blocks, shape)))
    elif family == "matmul":
        grid = [("8b", m) for m in (1, 16, 64, 256, 512, 2048, 8192)] + [("70b-tp8", m) for m in (64, 2048)]
        for model, m in grid:
            shape = MATMULS[model]
            out.append(_spec(w8a8_matmul.SPEC, f"w8a8.{model}-m{m}",
                             lambda blocks=None, chip=None, m=m, shape=shape: w8a8_matmul.bench(blocks, m, shape)))
            out.append(_spec(int4_matmul.SPEC, f"int4.{model}-m{m}",
                             lambda blocks=None, chip=None, m=m, shape=shape: int4_matmul.bench(blocks, m, shape)))
            out.append(_spec(fp8_matmul.SPEC, f"fp8.{model}-m{m}",
                             lambda blocks=None, chip=None, m=m, shape=shape:
                             fp8_matmul.bench(blocks, chip=chip, m=m, shape=shape)))
    elif family == "matmul-blocks":
        grid = [("8b", m) for m in (2048, 8192)] + [("70b-tp8", 2048)]
        for model, m in grid:
            shape = MATMULS[model]
            out.append(_spec(w8a8_matmul.SPEC, f"w8a8.{model}-m{m}.bm512",
                             lambda _=None, chip=None, m=m, shape=shape:
                             w8a8_matmul.bench(w8a8_matmul.BlockSizes(512, 2048), m, shape)))
            out.append(_spec(int4_matmul.SPEC, f"int4.{model}-m{m}.bm512",
                             lambda _=None, chip=None, m=m, shape=shape:
                             int4_matmul.bench(int4_matmul.BlockSizes(512, 1024, 4096), m, shape)))
            out.append(_spec(fp8_matmul.SPEC, f"fp8.{model}-m{m}.bm512",
                             lambda _=None, chip=None, m=m, shape=shape:
                             fp8_matmul.bench(fp8_matmul.BlockSizes(512, 2048), chip=chip, m=m, shape=shape)))
    elif family == "moe":
        pts = [(f"qwen3-30b-t{t}", {"tokens": t}) for t in (64, 256, 2048, 8192)]
        pts += [(f"qwen3-235b-t{t}", {**QWEN3_235B, "tokens": t}) for t in (256, 2048)]
        for name, shape in pts:
            out.append(_spec(fused_moe.SPEC, f"moe.{name}",
                             lambda blocks=None, chip=None, shape=shape: fused_moe.bench(blocks, shape)))
    else:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    return out


def summary(run_dirs) -> str:
    """One Markdown table of every row in the families' report.json under run_dirs (one a target,
    rows in run order): ours, XLA, JAX's or the peer's kernel, each ratio, and ours against the row's
    floor. A later run's row replaces an earlier one of the same name and target."""
    import json
    from pathlib import Path

    def cyc(c):
        return "-" if c is None else f"{c / 1e6:.2f}M" if c >= 1e6 else f"{c / 1e3:.1f}k"

    def ratio(r):
        return "-" if r is None else f"{r:.2f}x"

    rows = {}
    for d in run_dirs:
        reports = sorted(Path(d).glob("**/report.json"))
        if not reports:
            raise ValueError(f"{d}: no report.json under it (an --out folder of this script)")
        for rep in reports:
            doc = json.loads(rep.read_text())
            for r in doc.get("kernels", ()):
                rows[(doc["target"]["chip"], r["name"])] = r
    lines = ["| target | row | ours | XLA | vs XLA | JAX / peer | vs it | ours vs floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (chip, name), r in rows.items():
        jax_v = r.get("variants", {}).get("jax") or {}
        uncounted = jax_v.get("status") == "ok" and not jax_v.get("flops")
        vs_jax = ratio(r.get("ratio_vs_jax")) + (" (no FLOPs)" if uncounted and r.get("ratio_vs_jax") else "")
        lines.append(f"| {chip} | {name} | {cyc(r['kernel_cycles'])} | {cyc(r['xla_cycles'])} | "
                     f"{ratio(r['ratio_vs_xla'])} | {cyc(r.get('jax_cycles'))} | {vs_jax} | "
                     f"{ratio(r.get('kernel_vs_floor'))} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v6e")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--out", default=None, help="one run directory a family goes under it")
    parser.add_argument("--static-timeout", type=float, default=None,
                        help="seconds a module's static profile may take (default: sweep_common's)")
    parser.add_argument("--rows", nargs="+", metavar="TEXT",
                        help="run only the rows whose name contains one of these (e.g. int4. b1)")
    parser.add_argument("--summary", nargs="+", metavar="RUN_DIR",
                        help="print one table of the rows under these earlier --out folders and stop")
    args = parser.parse_args()
    from pathlib import Path

    if args.summary:
        try:
            print(summary(args.summary))
        except (ValueError, OSError) as e:  # a folder with no runs, an unreadable report
            print(f"sweep_serving: {e}", file=sys.stderr)
            return 2
        return 0

    from sweep_common import STATIC_TIMEOUT_S, bench_specs

    rc, ran = 0, 0
    for family in args.families:
        print(f"\n### {family} on {args.target}\n", flush=True)
        out = Path(args.out) / family if args.out else None
        rows = [sp for sp in specs(family) if not args.rows or any(t in sp.name for t in args.rows)]
        if not rows:
            print(f"sweep_serving: no {family} row matches {' '.join(args.rows)}", file=sys.stderr)
            continue
        ran += 1
        code = bench_specs("sweep_serving", rows, args.target, out,
                           args.static_timeout or STATIC_TIMEOUT_S)
        if code == 2:
            return 2
        rc = max(rc, code)
    return rc if ran else 2


if __name__ == "__main__":
    sys.exit(main())
