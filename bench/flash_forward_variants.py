"""Two other forms of the causal flash-attention forward at its bench shape (B1 H8 S2048 D128 bf16),
timed on an attached TPU beside the bundled kernel, or compiled for v5e here for their static cycles.

    python bench/flash_forward_variants.py OUT.jsonl            # on the chip: device time, 5 calls each
    python bench/flash_forward_variants.py --static DIR          # here: the TPU compiler's static cycles
    python bench/flash_forward_variants.py --check               # here: each variant against the reference

- `transposed`: score tiles with keys on sublanes and queries on lanes (s^T = k q^T), so the softmax's
  max and sum run over sublanes and the running statistics are lane vectors; P V as a transposed-LHS
  dot. `interleave` query chunks run sub-tile by sub-tile side by side, `heads` heads a grid step.
- `by_hand`: one grid step; heads in a loop, each head's q, k, v DMAed by hand during the one before
  it in `pieces` row pieces (each waited on before the first chunk that needs it), o written back a
  piece at a time. The TPU compiler's static profile cannot follow these DMAs (it aborts).

Both fix the bench shape and causal masking; neither is shipped (bench/RESULTS.md has the figures).
"""

from __future__ import annotations

import functools
import json
import math
import sys

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.flash_attention_bwd import LOG2E, MASK_VALUE, NT

S, D, H = 2048, 128, 8
TN = (((0,), (0,)), ((), ()))  # a.T @ b
_VMEM = 64 * 2**20


def _chunk_step(k, v, q, state, r0: int, c0: int, cq: int, ck: int, c: float):
    """One [ck keys, cq queries] sub-tile of query chunk r0 against keys c0..: the online softmax
    over sublanes; state (m, l, acc^T) or None before the chunk's first sub-tile."""
    st = lax.dot_general(k, q, NT, preferred_element_type=jnp.float32)  # [ck, cq]
    if c0 + ck - 1 > r0:  # crosses the diagonal
        diff = lax.broadcasted_iota(jnp.int32, st.shape, 0) - lax.broadcasted_iota(jnp.int32, st.shape, 1)
        st = jnp.where(diff <= r0 - c0, st, -jnp.inf)
    mc = jnp.max(st, axis=0, keepdims=True)
    m = None if state is None else state[0]
    mn = jnp.maximum(mc, MASK_VALUE) if m is None else jnp.maximum(m, mc)
    pt = jnp.exp2((st - mn) * c)
    pv = lax.dot_general(v, pt.astype(jnp.bfloat16), TN, preferred_element_type=jnp.float32)  # [D, cq]
    rs = jnp.sum(pt, axis=0, keepdims=True)
    if state is None:
        return mn, rs, pv
    a = jnp.exp2((m - mn) * c)
    return mn, a * state[1] + rs, state[2] * a + pv


def _head(q_ref, k_ref, v_ref, o_ref, c, cq, ck, interleave):
    for g0 in range(0, S, cq * interleave):
        chunks = list(range(g0, min(S, g0 + cq * interleave), cq))
        qs = {r0: q_ref[r0:r0 + cq, :] for r0 in chunks}
        state = dict.fromkeys(chunks)
        for c0 in range(0, chunks[-1] + cq, ck):
            for r0 in chunks:
                if c0 < r0 + cq:
                    state[r0] = _chunk_step(k_ref[c0:c0 + ck, :], v_ref[c0:c0 + ck, :], qs[r0], state[r0], r0, c0,
                                            cq, ck, c)
        for r0 in chunks:
            _, l, acc = state[r0]
            o_ref[r0:r0 + cq, :] = (acc * (1.0 / l)).T.astype(o_ref.dtype)


def transposed(cq: int = 128, ck: int = 128, interleave: int = 1, heads: int = 1, interpret: bool = False):
    c = LOG2E / math.sqrt(D)

    def kernel(q4, k4, v4, o4):
        for h in range(heads):
            _head(q4.at[h], k4.at[h], v4.at[h], o4.at[h], c, cq, ck, interleave)

    spec = pl.BlockSpec((None, heads, S, D), lambda b, h: (b, h, 0, 0))
    return pl.pallas_call(kernel, grid=(1, H // heads), in_specs=[spec] * 3, out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((1, H, S, D), jnp.bfloat16),
                          compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                                               vmem_limit_bytes=_VMEM),
                          interpret=interpret, name="flash_attention_fwd")


def by_hand(pieces: int = 1, interpret: bool = False):
    c, rows_a_piece, cq = LOG2E / math.sqrt(D), S // pieces, 128

    def kernel(q_hbm, k_hbm, v_hbm, o_hbm, qb, kb, vb, ob, isem, osem):
        def in_copies(h, slot, p):
            rows = pl.ds(p * rows_a_piece, rows_a_piece)
            return [pltpu.make_async_copy(src.at[0, h, rows], dst.at[slot, rows], isem.at[slot, p, i])
                    for i, (src, dst) in enumerate(((q_hbm, qb), (k_hbm, kb), (v_hbm, vb)))]

        def out_copy(h, slot, p):
            rows = pl.ds(p * rows_a_piece, rows_a_piece)
            return pltpu.make_async_copy(ob.at[slot, rows], o_hbm.at[0, h, rows], osem.at[slot, p])

        for p in range(pieces):
            for cp in in_copies(0, 0, p):
                cp.start()

        def body(h, carry):
            slot = lax.rem(h, 2)

            @pl.when(h + 1 < H)
            def _():
                for p in range(pieces):
                    for cp in in_copies(h + 1, 1 - slot, p):
                        cp.start()

            @pl.when(h >= 2)
            def _():
                for p in range(pieces):
                    out_copy(h - 2, slot, p).wait()

            q_ref, k_ref, v_ref, o_ref = qb.at[slot], kb.at[slot], vb.at[slot], ob.at[slot]
            for r0 in range(0, S, cq):
                if r0 % rows_a_piece == 0:
                    for cp in in_copies(h, slot, r0 // rows_a_piece):
                        cp.wait()
                state = None
                for c0 in range(0, r0 + cq, cq):
                    state = _chunk_step(k_ref[c0:c0 + cq, :], v_ref[c0:c0 + cq, :], q_ref[r0:r0 + cq, :], state,
                                        r0, c0, cq, cq, c)
                o_ref[r0:r0 + cq, :] = (state[2] * (1.0 / state[1])).T.astype(o_ref.dtype)
                if (r0 + cq) % rows_a_piece == 0:
                    out_copy(h, slot, (r0 + cq) // rows_a_piece - 1).start()
            return carry

        lax.fori_loop(0, H, body, 0)
        for h in range(max(H - 2, 0), H):
            for p in range(pieces):
                out_copy(h, h % 2, p).wait()

    anyspec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(kernel, grid=(1,), in_specs=[anyspec] * 3, out_specs=anyspec,
                          scratch_shapes=[pltpu.VMEM((2, S, D), jnp.bfloat16)] * 4
                          + [pltpu.SemaphoreType.DMA((2, pieces, 3)), pltpu.SemaphoreType.DMA((2, pieces))],
                          out_shape=jax.ShapeDtypeStruct((1, H, S, D), jnp.bfloat16),
                          compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                                               vmem_limit_bytes=_VMEM),
                          interpret=interpret, name="flash_attention_fwd")


VARIANTS = {
    "transposed": dict(fn=transposed, kw={}),
    "transposed_interleave2": dict(fn=transposed, kw=dict(interleave=2)),
    "transposed_heads2": dict(fn=transposed, kw=dict(heads=2)),
    "transposed_128x256": dict(fn=transposed, kw=dict(ck=256)),
    **{f"by_hand_{n}": dict(fn=by_hand, kw=dict(pieces=n)) for n in (1, 2, 4, 8)},
}


def _call(name):
    v = VARIANTS[name]
    return lambda q, k, v_: v["fn"](**v["kw"])(q, k, v_)


def main(argv: list[str]) -> int:
    from tpudiag.kernels import flash_attention as fa

    setup = fa.bench()
    sds = setup.args_for("kernel")
    if argv[:1] == ["--check"]:
        import numpy as np

        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (1, H, S, D), jnp.float32).astype(jnp.bfloat16) for kk in ks)
        ref = np.asarray(fa.reference(q, k, v, causal=True), np.float32)
        for name, var in VARIANTS.items():
            got = np.asarray(var["fn"](**var["kw"], interpret=True)(q, k, v), np.float32)
            print(f"{name}: max |err| {np.abs(got - ref).max():.4g} (|ref| up to {np.abs(ref).max():.3g})")
        return 0
    if argv[:1] == ["--static"] and len(argv) == 2:
        import sweep_common  # bench/ is sys.path[0]: the script runs as `python bench/...`

        for name in ["kernel", *VARIANTS]:
            fn = setup.kernel if name == "kernel" else _call(name)
            r = sweep_common.measure(fn, sds, "v5e", f"{argv[1]}/{name}", fresh=True)
            print(f"{name}: {r['status']} static {r['static_kernel']} {r['error'] or ''}", flush=True)
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if jax.default_backend() != "tpu":
        print("flash_forward_variants: timing needs an attached TPU; here use --static DIR or --check", file=sys.stderr)
        return 2
    from tpudiag.capture.chip_bench import time_functions
    from tpudiag.targets import resolve_target

    chip = resolve_target("v5e").chip
    items = [("kernel", setup.kernel, sds)] + [(name, _call(name), sds) for name in VARIANTS]
    with open(argv[0], "a") as out:
        def emit(row):
            if row.get("status") != "running":
                out.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)

        time_functions("flash_attention", items, 5, 2 * chip.vmem_bytes, emit, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
