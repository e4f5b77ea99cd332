"""The bundled kernel for a matched pattern, at the pattern's own shapes: what `tpudiag suggest`
compiles for the target to price the replacement, and the snippet it shows.

`setup_for(detector, shapes, notes)` returns an `AtShapes` (the kernel's name, its arguments as
`jax.ShapeDtypeStruct`s, the function to lower, a drop-in snippet with the real shapes filled in)
or a one-line reason why no bundled kernel fits. The detector names its kernel (`Detector.kernel`,
or why none fits in `Detector.no_kernel`); this module builds each named kernel's arguments from
the detector's typed shapes. Imports jax only when called; compiles and runs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class AtShapes:
    kernel: str
    args: tuple  # jax.ShapeDtypeStruct
    fn: Callable
    snippet: str
    description: str  # the shapes as the kernel sees them
    # Arguments `fn` writes and returns (a cache updated in place): donated where it is lowered, as
    # a serving engine donates its KV cache; otherwise XLA copies them whole on every call.
    donate: tuple[int, ...] = ()
    # The kernel's plain-JAX twin at the same arguments and parameters (its spec's bench `xla`
    # computation): what XLA runs without the kernel. `suggest --measure` times both on the chip.
    xla: Callable | None = None
    # The rule kernels/bench_inputs.py draws concrete arguments by (the kernel's name, unless its
    # integer metadata differs from its bench setup's: a decode batch of one token a sequence).
    inputs: str = ""
    # The chip table's entry for the path this call takes inside the kernel (kernels/measured.py),
    # where it differs from the bench's: sampling's top-p over the whole row without a top-k.
    measured_as: str = ""
    # The kernel's time here over what its floor says, where a grid step with fewer rows than its
    # block costs a whole block (a latency-bound step): the chip table's share of the floor, measured
    # at whole blocks, applies to this many floors.
    step_scale: float = 1.0


def _jnp(dtype: str):
    import jax.numpy as jnp

    return {"bf16": jnp.bfloat16, "f32": jnp.float32, "f16": jnp.float16}.get(dtype, jnp.bfloat16)


# kernels/bench_inputs.py's rule for a ragged paged attention decode batch at the program's shapes:
# one token a sequence, full lengths in the pool's own page size (the bench setup's rule assumes its
# production page size and a prefill chunk).
DECODE_INPUTS = "ragged_paged_attention.decode"

_MASK_WORDS = {"causal": "causal with a diagonal offset", "window": "a sliding window",
               "inputs": "computed from the program's inputs (padding or a position)",
               "other": "neither causal nor a window", "unknown": "one tpudiag could not read"}


def _flash_attention(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.flash_attention import flash_attention, xla_attention

    bh, sq, sk, d = shapes.batch_heads, shapes.q_len, shapes.kv_len, shapes.head_dim
    if sq != sk:
        return f"flash_attention takes self-attention (query length = key length); here {sq} vs {sk}"
    if d % 64 or sq % 128:
        return f"flash_attention needs head_dim a multiple of 64 and a sequence a multiple of 128 (D{d} S{sq})"
    mask = getattr(shapes, "mask", "none")
    if mask not in ("none", "causal", "window") or mask in ("causal", "window") and shapes.mask_offset:
        return (f"flash_attention masks causally (query i sees keys j <= i), within a sliding window, or not at all; "
                f"this attention's mask is {_MASK_WORDS.get(mask, mask)}, which the kernel would drop or change")
    dt = "bf16"  # the kernel reads bf16 Q, K, V with an f32 softmax
    q = jax.ShapeDtypeStruct((1, bh, sq, d), _jnp(dt))
    causal = mask in ("causal", "window")
    window = shapes.mask_window if mask == "window" else None

    def fn(q, k, v):
        return flash_attention(q, k, v, causal=causal, window=window)

    args = f"causal={causal}" + (f", window={window}" if window else "")
    snippet = ("from tpudiag.kernels.flash_attention import flash_attention\n"
               f"# q [B, H, {sq}, {d}] bf16; k, v [B, KVH, {sk}, {d}] bf16 (KVH divides H); here B*H = {bh}\n"
               f"out = flash_attention(q, k, v, {args})  # -> [B, H, {sq}, {d}]")
    def xla(q, k, v):
        return xla_attention(q, k, v, causal=causal, window=window)

    shown = (" causal" if causal else "") + (f" window {window}" if window else "")
    return AtShapes("flash_attention", (q, q, q), fn, snippet, f"B1 H{bh} S{sq} D{d} bf16{shown}", xla=xla)


def _paged_attention(shapes, notes) -> AtShapes | str:
    """Decode attention over a KV cache, at the program's batch, heads, page size and pages a
    sequence (full lengths: the lengths are data): the bundled paged attention where the keys come
    through a page table, ragged paged attention where the step writes the cache it reads or the
    cache is contiguous (pages in order)."""
    import jax

    from tpudiag.kernels.paged_attention import paged_attention, xla_paged_attention

    b, d, page = getattr(shapes, "batch", 0), shapes.head_dim, getattr(shapes, "page_size", 0)
    if not b:
        return ("the paged kernels read a KV cache in pages; tpudiag found no KV cache whose sequences it could "
                "tell from its KV heads, so no kernel is priced")
    h, kvh = shapes.batch_heads // b, shapes.kv_batch_heads // b
    if not kvh or h % kvh:
        return f"the paged kernels take query heads a multiple of the KV heads (here {h} and {kvh})"
    if not page:  # a contiguous cache is pages in order
        page = next((p for p in (128, 64, 32, 16) if shapes.kv_len % p == 0), 0)
        if not page:
            return f"ragged_paged_attention reads pages of 16 to 128 positions; this cache holds {shapes.kv_len}"
        return _ragged_paged_attention(b, h, kvh, d, page, shapes.kv_len // page,
                                       write=getattr(shapes, "kv_written", False), contiguous=True)
    pps = shapes.kv_len // page
    if getattr(shapes, "kv_written", False):
        return _ragged_paged_attention(b, h, kvh, d, page, pps)
    sds, jnp = jax.ShapeDtypeStruct, jax.numpy
    args = (sds((b, h, d), jnp.bfloat16), sds((kvh, b * pps, page, d), jnp.bfloat16),
            sds((kvh, b * pps, page, d), jnp.bfloat16), sds((b,), jnp.int32), sds((b, pps), jnp.int32))
    snippet = ("from tpudiag.kernels.paged_attention import paged_attention\n"
               f"# q [{b}, {h}, {d}] bf16; k_pages, v_pages [{kvh}, pages, {page}, {d}] bf16 (KV heads first); "
               f"lengths [{b}] int32; page_table [{b}, {pps}] int32\n"
               "out = paged_attention(q, k_pages, v_pages, lengths, page_table)  # reads only the live pages")
    return AtShapes("paged_attention", args, paged_attention, snippet,
                    f"B{b} H{h} KVH{kvh} D{d} page{page} x {pps} pages (full lengths)", xla=xla_paged_attention)


def _ragged_paged_attention(b: int, h: int, kvh: int, d: int, page: int, pps: int, *, write: bool = True,
                            contiguous: bool = False) -> AtShapes:
    """A decode step over a KV cache: the bundled ragged paged attention, one token a sequence (full
    lengths), with its page write where the step writes its new keys and values into the cache it
    reads. A contiguous cache is priced as pages in order."""
    import jax

    from tpudiag.kernels.ragged_paged_attention import (ragged_paged_attention, write_kv_pages,
                                                        xla_ragged_paged_attention)

    sds, jnp = jax.ShapeDtypeStruct, jax.numpy
    pages = sds((kvh, b * pps, page, d), jnp.bfloat16)
    new = sds((b, kvh, d), jnp.bfloat16)
    meta = (sds((b,), jnp.int32), sds((b, pps), jnp.int32), sds((b + 1,), jnp.int32), sds((1,), jnp.int32))
    layout = (f"# a contiguous cache is pages in order: keep it as [{kvh}, {b * pps}, {page}, {d}] (KV heads first) "
              f"with page_table = arange({b * pps}).reshape({b}, {pps})\n" if contiguous else "")
    head = ("from tpudiag.kernels.ragged_paged_attention import ragged_paged_attention"
            + (", write_kv_pages\n" if write else "\n") + layout
            + f"# q [{b}, {h}, {d}] bf16 (one decode token a sequence; prefill chunks may join the batch); "
            + (f"new_k, new_v [{b}, {kvh}, {d}]; " if write else "")
            + f"k_pages, v_pages [{kvh}, pages, {page}, {d}] bf16 (KV heads first)\n"
            + f"# kv_lens [{b}]" + (" (the new token included)" if write else "")
            + f", page_table [{b}, {pps}], cu_q_lens [{b + 1}] = arange: one token each, num_seqs [1], all int32\n")
    attend = "out = ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs)"
    what = (f"B{b} H{h} KVH{kvh} D{d} page{page} x {pps} pages{' in order (a contiguous cache)' if contiguous else ''}, "
            "one decode token each (full lengths)")
    if not write:
        return AtShapes("ragged_paged_attention", (sds((b, h, d), jnp.bfloat16), pages, pages, *meta),
                        ragged_paged_attention, head + attend, what, xla=xla_ragged_paged_attention,
                        inputs=DECODE_INPUTS)

    def fn(q, new_k, new_v, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs):
        k_pages, v_pages = write_kv_pages(k_pages, v_pages, new_k, new_v, kv_lens, table, cu_q_lens, num_seqs)
        return ragged_paged_attention(q, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs), k_pages, v_pages

    def xla(q, new_k, new_v, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs):
        k_pages, v_pages = write_kv_pages(k_pages, v_pages, new_k, new_v, kv_lens, table, cu_q_lens, num_seqs)
        return (xla_ragged_paged_attention(q, k_pages, v_pages, kv_lens, table, cu_q_lens, num_seqs), k_pages,
                v_pages)

    snippet = (head + "k_pages, v_pages = write_kv_pages(k_pages, v_pages, new_k, new_v, kv_lens, page_table, "
               "cu_q_lens, num_seqs)  # in place: donate the pools to the step's jit\n" + attend)
    return AtShapes("ragged_paged_attention", (sds((b, h, d), jnp.bfloat16), new, new, pages, pages, *meta), fn,
                    snippet, what + ", with the page write (pool donated)", donate=(3, 4), xla=xla,
                    inputs=DECODE_INPUTS)


def _mla_decode(shapes, notes) -> AtShapes | str:
    """MLA decode with the up-projections absorbed, at the program's batch, heads, context, latent
    and RoPE widths: the cache as pages of rows of [latent | RoPE key | zeros] (a contiguous cache is
    pages in order), 1024 rows a page as tpu-inference's MLA cache on TPU (a shorter context: one page
    of it, rounded up to 16 rows), so that each DMA is long (mla_decode.default_blocks)."""
    import jax

    from tpudiag.kernels.mla_decode import TPU_PAGE, mla_decode, padded_width, xla_mla_decode

    b, h, t, lat, r = shapes.batch, shapes.heads, shapes.kv_len, shapes.latent, shapes.rope
    if lat % 128:
        return f"mla_decode takes a latent of whole 128-lane tiles (here {lat})"
    page = min(TPU_PAGE, -(-t // 16) * 16)
    pps = -(-t // page)
    w = padded_width(lat, r) if r else lat
    scale = 1.0 / (shapes.qk_head_dim ** 0.5)
    sds, jnp = jax.ShapeDtypeStruct, jax.numpy
    args = (sds((b, h, w), jnp.bfloat16), sds((b * pps, page, w), jnp.bfloat16), sds((b,), jnp.int32),
            sds((b, pps), jnp.int32))

    def fn(q, kv, lengths, table):
        return mla_decode(q, kv, lengths, table, latent=lat, sm_scale=scale)

    snippet = ("from tpudiag.kernels.mla_decode import mla_decode, padded_width\n"
               f"# absorb W_UK into the query and keep W_UV for after: q = [q_nope @ W_UK^T (per head, -> {lat}) | "
               f"q_pe ({r}) | zeros] -> [{b}, {h}, {w}]\n"
               f"# cache rows [latent {lat} | RoPE key {r} | zeros], pages of {page}: kv_pages [pages, {page}, {w}]\n"
               f"o = mla_decode(q, kv_pages, lengths, page_table, latent={lat}, sm_scale={scale:.6g})  "
               f"# [{b}, {h}, {lat}]\n"
               "out = jnp.einsum(\"bhl,lhd->bhd\", o, w_uv)")
    def xla(q, kv, lengths, table):
        return xla_mla_decode(q, kv, lengths, table, latent=lat, sm_scale=scale)

    return AtShapes("mla_decode", args, fn, snippet, f"B{b} H{h} T{t} latent{lat} rope{r} (rows of {w}, pages of {page})",
                    xla=xla)


def _eps(shapes) -> str:
    """The program's own epsilon where the HLO holds it as a constant, else the kernel's default."""
    eps = getattr(shapes, "eps", None)
    return repr(eps) if eps is not None else "1e-6"


def _rmsnorm(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.rmsnorm import reference, rmsnorm_residual

    n, h = shapes.rows, shapes.hidden
    if h % 128:
        return f"rmsnorm_residual needs hidden a multiple of 128 (here {h})"
    x = jax.ShapeDtypeStruct((n, h), _jnp("bf16"))
    snippet = ("from tpudiag.kernels.rmsnorm import rmsnorm_residual\n"
               f"normed, resid = rmsnorm_residual(x, resid, weight, eps={_eps(shapes)})  # x, resid [{n}, {h}] bf16, "
               f"weight [{h}]")
    eps = float(_eps(shapes))
    return AtShapes("rmsnorm", (x, x, jax.ShapeDtypeStruct((h,), _jnp("bf16"))),
                    lambda x, r, w: rmsnorm_residual(x, r, w, eps=eps), snippet,
                    f"N{n} D{h} bf16", xla=lambda x, r, w: reference(x, r, w, eps=eps))


def _cross_entropy(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.cross_entropy import cross_entropy, xla_cross_entropy

    n, v = shapes.rows, shapes.vocab
    if v % 128:
        return f"cross_entropy needs the vocabulary a multiple of 128 (here {v})"
    snippet = ("from tpudiag.kernels.cross_entropy import cross_entropy\n"
               f"loss = cross_entropy(logits, labels).mean()  # logits [{n}, {v}] bf16, labels [{n}] int32")
    return AtShapes("cross_entropy", (jax.ShapeDtypeStruct((n, v), _jnp("bf16")),
                                      jax.ShapeDtypeStruct((n,), jax.numpy.int32)), cross_entropy,
                    snippet, f"N{n} V{v} bf16", xla=xla_cross_entropy)


def _sampling(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.sampling import DEFAULT_BLOCKS, sample, xla_sample
    from tpudiag.kernels.tiling import round_up

    b, v = shapes.rows, shapes.vocab
    if v % 128:
        return f"sample needs the vocabulary a multiple of 128 (here {v})"
    # The program's own parameters (constants in its HLO); none found: no top-k, p = 1, temperature 1.
    k = getattr(shapes, "top_k", None)
    p = getattr(shapes, "top_p", None)
    t = getattr(shapes, "temperature", None)
    p_, t_ = (1.0 if p is None else p), (1.0 if t is None else t)

    def fn(logits, u):
        return sample(logits, u, k=k, p=p_, temperature=t_)

    snippet = ("from tpudiag.kernels.sampling import sample\n"
               f"tokens = sample(logits, u, k={k}, p={p_:g}, temperature={t_:g})  # logits [{b}, {v}] f32, "
               f"u [{b}] uniform f32: the same distribution as the program's, not the same draws")
    return AtShapes("sampling", (jax.ShapeDtypeStruct((b, v), jax.numpy.float32),
                                 jax.ShapeDtypeStruct((b,), jax.numpy.float32)), fn, snippet,
                    f"B{b} V{v} f32 k={k} p={p_:g} temperature={t_:g}",
                    xla=lambda logits, u: xla_sample(logits, u, k=k, p=p_, temperature=t_),
                    measured_as="sampling@top_p" if k is None and p_ < 1.0 else "",
                    # The search is latency-bound per grid step up to a block's rows: on a v5e one 8-row
                    # step took 17.8 us (B8 V131072, top-k 64) and 16-row steps 18.2 us each (B64: 72.9).
                    step_scale=round_up(b, DEFAULT_BLOCKS.block_rows) / b)


def _int8_matmul(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.int8_matmul import int8_matmul, xla_int8_matmul

    if shapes.weight_dtype in ("s4", "u4"):
        return _int4_matmul(shapes, notes)
    if shapes.weight_dtype == "f8e4m3fn":  # x stays as it is: the weight-only mode
        k, n, m = math.prod(shapes.weight[:-1]), shapes.weight[-1], math.prod(shapes.out[:-1])
        if shapes.group not in (None, k):
            return (f"fp8_matmul takes one scale per output channel; these e4m3 weights have a scale per "
                    f"{shapes.group} rows of K")
        return _fp8_matmul(m, k, n, "bf16", "bf16")
    (k, n), (m, _) = shapes.weight, shapes.out
    if shapes.weight_dtype != "s8":
        return f"int8_matmul takes int8 weights (here {shapes.weight_dtype})"
    if k % 128 or n % 128:
        return f"int8_matmul needs K and N multiples of 128 (K{k} N{n})"
    snippet = ("from tpudiag.kernels.int8_matmul import int8_matmul\n"
               f"y = int8_matmul(x, w_int8, scales)  # x [{m}, {k}] bf16, w [{k}, {n}] int8, scales [{n}] f32")
    return AtShapes("int8_matmul", (jax.ShapeDtypeStruct((m, k), _jnp("bf16")),
                                    jax.ShapeDtypeStruct((k, n), jax.numpy.int8),
                                    jax.ShapeDtypeStruct((n,), jax.numpy.float32)), int8_matmul, snippet,
                    f"M{m} K{k} N{n}", xla=xla_int8_matmul)


def _int4_matmul(shapes, notes) -> AtShapes | str:
    """Signed int4 weights with group scales (the dequantize-then-matmul pattern's 4-bit form)."""
    import jax

    from tpudiag.kernels.int4_matmul import int4_matmul, xla_int4_matmul

    if shapes.weight_dtype != "s4":
        return f"int4_matmul takes signed int4 weights (here {shapes.weight_dtype})"
    m, n = shapes.out[0] if len(shapes.out) == 2 else 1, shapes.weight[-1]
    k = 1
    for d in shapes.weight[:-1]:
        k *= d
    group = shapes.group or k
    if n % 128 or k % 128:
        return f"int4_matmul needs K and N multiples of 128 (K{k} N{n})"
    if k % group:
        return f"int4_matmul needs groups that divide K (K{k}, groups of {group})"
    scales = "one per channel" if group == k else f"groups of {group}"
    snippet = ("from tpudiag.kernels.int4_matmul import int4_matmul\n"
               f"y = int4_matmul(x, w_int4, scales)  # x [{m}, {k}] bf16, w [{k}, {n}] jnp.int4, "
               f"scales [{k // group}, {n}] f32 ({scales})")
    return AtShapes("int4_matmul", (jax.ShapeDtypeStruct((m, k), _jnp("bf16")),
                                    jax.ShapeDtypeStruct((k, n), jax.numpy.int4),
                                    jax.ShapeDtypeStruct((k // group, n), jax.numpy.float32)), int4_matmul, snippet,
                    f"M{m} K{k} N{n} int4, {scales}", xla=xla_int4_matmul)


def _fp8_matmul(m: int, k: int, n: int, activations: str, dtype: str) -> AtShapes | str:
    """e4m3 weights with channel scales: weight-only (a dequantize-then-matmul) or with the
    activations quantized per token (an fp8 W8A8 layer)."""
    import jax

    from tpudiag.kernels.fp8_matmul import fp8_matmul, xla_fp8_matmul

    if n % 128:
        return f"fp8_matmul needs N a multiple of 128 (N{n})"
    mode = "weight-only" if activations == "bf16" else "activations quantized per token inside"
    snippet = ("from tpudiag.kernels.fp8_matmul import fp8_matmul\n"
               f"y = fp8_matmul(x, w_e4m3, w_scale, activations={activations!r})  # x [{m}, {k}] {dtype} ({mode}), "
               f"w [{k}, {n}] float8_e4m3fn, w_scale [{n}] f32")

    def fn(x, w, w_scale):
        return fp8_matmul(x, w, w_scale, activations=activations)

    return AtShapes("fp8_matmul", (jax.ShapeDtypeStruct((m, k), _jnp(dtype)),
                                   jax.ShapeDtypeStruct((k, n), jax.numpy.float8_e4m3fn),
                                   jax.ShapeDtypeStruct((n,), jax.numpy.float32)), fn, snippet,
                    f"M{m} K{k} N{n} e4m3, {mode}",
                    xla=lambda x, w, w_scale: xla_fp8_matmul(x, w, w_scale, activations=activations))


def _w8a8_matmul(shapes, notes) -> AtShapes | str:
    import jax

    from tpudiag.kernels.w8a8_matmul import w8a8_matmul, xla_w8a8_matmul

    (m, k), (k2, n) = shapes.activations[-2:], shapes.weight[-2:]
    if k != k2:
        return f"w8a8_matmul takes x [M, K] @ w [K, N] (here x {shapes.activations}, w {shapes.weight})"
    dtype = shapes.dtype if shapes.dtype in ("bf16", "f32") else "bf16"
    if getattr(shapes, "quant_dtype", "s8") == "f8e4m3fn":
        return _fp8_matmul(m, k, n, "fp8", dtype)
    if n % 128:
        return f"w8a8_matmul needs N a multiple of 128 (N{n})"
    snippet = ("from tpudiag.kernels.w8a8_matmul import w8a8_matmul\n"
               f"y = w8a8_matmul(x, w_int8, w_scale)  # x [{m}, {k}] {dtype} (quantized per token inside), "
               f"w [{k}, {n}] int8, w_scale [{n}] f32")
    return AtShapes("w8a8_matmul", (jax.ShapeDtypeStruct((m, k), _jnp(dtype)),
                                    jax.ShapeDtypeStruct((k, n), jax.numpy.int8),
                                    jax.ShapeDtypeStruct((n,), jax.numpy.float32)), w8a8_matmul, snippet,
                    f"M{m} K{k} N{n}", xla=xla_w8a8_matmul)


def _fused_moe(shapes, notes) -> AtShapes | str:
    """A routed MoE at the program's tokens, experts, top-k and widths (softmax routing
    renormalized: the scoring changes no figure the price depends on)."""
    import jax

    from tpudiag.kernels.fused_moe import fused_moe, reference

    if not hasattr(shapes, "hidden"):
        return ("a ragged-dot is routed already: its tokens are sorted by expert with group sizes, so "
                "grouped_matmul (tpudiag kernels show grouped_matmul) takes it as it is")
    t, e, k, d, f = shapes.tokens, shapes.experts, shapes.top_k, shapes.hidden, shapes.ffn
    if not d or not f:
        return "fused_moe needs the experts' [E, D, F] weights, which this dispatch does not show"
    if shapes.matmuls < 3:
        return (f"fused_moe runs SwiGLU experts (gate, up and down: 3 matmuls); this dispatch has "
                f"{shapes.matmuls} expert matmul(s)")
    dt = _jnp(shapes.dtype if shapes.dtype in ("bf16", "f32") else "bf16")
    sds = jax.ShapeDtypeStruct
    args = (sds((t, d), dt), sds((d, e), dt), sds((e, d, f), dt), sds((e, d, f), dt), sds((e, f, d), dt))

    def fn(x, r, wg, wu, wd):
        return fused_moe(x, r, wg, wu, wd, top_k=k)

    snippet = ("from tpudiag.kernels.fused_moe import fused_moe\n"
               f"# x [{t}, {d}], router_w [{d}, {e}], w_gate and w_up [{e}, {d}, {f}], w_down [{e}, {f}, {d}]\n"
               f"out = fused_moe(x, router_w, w_gate, w_up, w_down, top_k={k})  # softmax routing "
               "renormalized over the top-k; scoring=\"sigmoid\", renormalize=False for other routers")
    return AtShapes("fused_moe", args, fn, snippet, f"T{t} D{d} F{f} E{e} top-{k} {shapes.dtype}",
                    xla=lambda x, r, wg, wu, wd: reference(x, r, wg, wu, wd, top_k=k))


# Each kernel a detector may name (its `kernel`: the kernel's name in kernels/registry.py), and how
# its arguments are built from that detector's shapes.
BUILDERS: dict[str, Callable] = {
    "flash_attention": _flash_attention,
    "paged_attention": _paged_attention,
    "mla_decode": _mla_decode,
    "rmsnorm": _rmsnorm,
    "cross_entropy": _cross_entropy,
    "sampling": _sampling,
    "int8_matmul": _int8_matmul,
    "w8a8_matmul": _w8a8_matmul,
    "fused_moe": _fused_moe,
}


def setup_for(detector, shapes, notes=()) -> AtShapes | str:
    """`detector`'s kernel at `shapes` (its typed shapes; `notes`: the match's, e.g. a mask makes
    attention causal), or why none fits."""
    if detector.kernel is None:
        return detector.no_kernel
    return BUILDERS[detector.kernel](shapes, notes)


def with_backward(s: AtShapes) -> AtShapes | str:
    """The kernel's forward and backward (the gradient of the sum of its outputs with respect to its
    floating-point inputs), and its XLA twin's likewise, for a pattern whose XLA ops include the
    gradient; or why it has none."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from tpudiag.kernels.registry import get_spec

    if not get_spec(s.kernel).differentiable:
        return f"{s.kernel} has no backward kernel, and these ops include the gradient"
    floats = tuple(k for k, a in enumerate(s.args) if jnp.issubdtype(a.dtype, jnp.floating))

    def train(fn):
        def loss(*args):
            leaves = jax.tree_util.tree_leaves(fn(*args))
            return sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)

        def step(*args):
            return jax.value_and_grad(loss, argnums=floats)(*args)

        return step

    return dataclasses.replace(s, fn=train(s.fn), xla=None if s.xla is None else train(s.xla),
                               description=s.description + ", forward and backward")


def arg_specs(args) -> list[list]:
    """`args` (ShapeDtypeStructs) as JSON: [[shape, dtype name], ...]."""
    return [[list(a.shape), str(a.dtype)] for a in args]


def request(kernel: str, shapes: dict, notes, backward: bool, s: AtShapes) -> dict:
    """What a chip worker needs to build `s` again in its own process (`from_request`): the kernel's
    name, the match's shapes (its `Shapes.to_dict()`), notes and whether the gradient is included;
    with the arguments `s` takes, which the worker checks its own build against."""
    return {"kernel": kernel, "shapes": dict(shapes), "notes": list(notes), "backward": bool(backward),
            "args": arg_specs(s.args), "description": s.description}


def from_request(req: dict) -> AtShapes | str:
    """The kernel of a `request`, built again from its JSON (the builders read the shapes by
    attribute), forward and backward where it says so; or why it cannot be."""
    from types import SimpleNamespace

    if req["kernel"] not in BUILDERS:
        return f"no bundled kernel {req['kernel']!r} builds at a pattern's shapes"
    s = BUILDERS[req["kernel"]](SimpleNamespace(**req["shapes"]), tuple(req.get("notes", ())))
    if not isinstance(s, str) and req.get("backward"):
        s = with_backward(s)
    if not isinstance(s, str) and arg_specs(s.args) != req["args"]:
        return f"built {arg_specs(s.args)} from the request, not its {req['args']}"
    return s
