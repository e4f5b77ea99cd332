"""Fused MoE for serving: routing, token sort, SwiGLU experts and combine in one call.

`fused_moe(x [T, D], router_w [D, E], w_gate [E, D, F], w_up [E, D, F], w_down [E, F, D], *, top_k)`
returns out [T, D] in x's dtype:

    logits = x @ router_w (f32)                 scores = softmax(logits) or sigmoid(logits)
    experts[t] = the top_k logits of t          (scores rank as the logits do; equal logits: the
                                                 lower expert index first, as jax.lax.top_k)
    w[t, j] = scores[t, experts[t, j]]          (divided by their sum with `renormalize`)
    out[t] = sum_j w[t, j] * (silu(x[t] @ w_gate[e]) * (x[t] @ w_up[e])) @ w_down[e],  e = experts[t, j]

How: the T * top_k (token, expert) pairs are sorted by expert (one stable sort carrying each
pair's index and weight) and their token rows taken into expert order; two Pallas grouped-matmul
calls over the sorted rows (`grouped_matmul.gmm_pallas` and its visit schedule) compute the
experts: the first multiplies each row by its expert's gate and up matrices together and applies
the SwiGLU in VMEM, so only silu(g) * u [T * top_k, F] goes to HBM; the second multiplies by the
down matrices. Each expert's weights are read once per column block and only for the rows routed to
it: top_k / E of the dense dispatch's FLOPs. The combine takes the pairs back to token order,
weighted and summed in f32. Moving the rows (`dispatch`): up to `ONEHOT_MAX_TOKENS` tokens by
one-hot matmuls on the MXU ([T * top_k, T] selections, exact), above by XLA's row gathers. Either
way a token with a non-finite element gets a non-finite output row (all NaN with the one-hot
matmuls) and the other tokens are untouched.
Forward only: a serving kernel (training takes `grouped_matmul`, which has a backward).

Holds the routing, the kernel wrapper, the pure-JAX reference (the dense dispatch: every expert on
every token, weighted by the routing), MaxText-style routing through JAX's megablox gmm for the
bench, and the `SPEC`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from tpudiag.kernels.grouped_matmul import BlockSizes as GmmBlocks
from tpudiag.kernels.grouped_matmul import _pad_to, gmm_pallas, make_plan
from tpudiag.kernels.grouped_matmul_schedule import keep_in_hbm, make_schedule
from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance, at_shape

SCORINGS = ("softmax", "sigmoid")
_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))

# Production shape: Qwen3-30B-A3B's MoE layer (d_model 2048, 128 experts of intermediate 768, top-8,
# softmax routing renormalized over the chosen 8), one prefill chunk of 2048 tokens: 16,384 routed rows,
# 128 a expert on average.
PROD = dict(tokens=2048, d=2048, f=768, e=128, top_k=8)
TUNED_FOR = "Qwen3-30B-A3B MoE: T2048 D2048 F768 E128 top-8 softmax renormalized, bf16"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """The grouped-matmul tiles of the two expert calls: `gate_up` for x @ [gate | up] (K = D,
    N = F) and `down` for h @ down (K = F, N = D). Each block shrinks to its dimension."""

    # On a v5e chip at the bench shape (device time): 128-row tiles computed whole 3,068 us; in
    # 32-row slices 2,721 us (a tile two experts share multiplies only its slices of each);
    # 256-row tiles in 32-row slices 2,453 us (half the grid steps, each weight block visited once).
    gate_up: GmmBlocks = GmmBlocks(block_m=256, block_k=2048, block_n=768, compute_m=32)
    down: GmmBlocks = GmmBlocks(block_m=256, block_k=768, block_n=2048, compute_m=32)

    def __post_init__(self):
        for name in ("gate_up", "down"):
            if not isinstance(getattr(self, name), GmmBlocks):
                raise ValueError(f"BlockSizes.{name} must be a grouped_matmul.BlockSizes, got "
                                 f"{getattr(self, name)!r}")

    def text(self) -> str:
        return f"gate_up: {self.gate_up.text()}; down: {self.down.text()}"


def default_blocks(d: int) -> BlockSizes:
    """The blocks `block_sizes=None` takes for a model dimension D: all of D as gate/up's K block and
    down's N block, so the expert's weight blocks do not change while the grid walks its row tiles
    and each is read once; F in blocks of 768; row tiles of 256 multiplied in 32-row slices. At Qwen3-235B-A22B's D 4096 and F 1536, 2048 tokens
    (v6e, `bench/sweep_serving.py`): 10.21M cycles with `BlockSizes()`, whose K blocks of 2048 make
    every row tile fetch its expert's weights again, 8.88M with rows of 256 alone, 7.41M with all of
    D (with rows of 128 and all of D the static-profile compile runs out of VMEM). On a v5e chip at
    D 2048 (device time), rows of 256 multiplied in 32-row slices take 2,453 us against 3,068 with
    rows of 128 multiplied whole (`BlockSizes` has the sweep)."""
    return BlockSizes(gate_up=GmmBlocks(block_m=256, block_k=d, block_n=768, compute_m=32),
                      down=GmmBlocks(block_m=256, block_k=768, block_n=d, compute_m=32))


# Tokens up to which `dispatch=None` moves the rows by one-hot matmuls ("onehot") instead of XLA's
# row gathers and the inverse permutation's scatter ("gather"). The matmuls cost 6 * P * T * D FLOPs
# (P = T * top_k rows: the dispatch, and the combine's f32 weights as two bf16 halves) where the
# gathers move about 8 * P * D bytes, so they pay while 0.75 * T is under the chip's FLOPs per HBM
# byte (v5p 166, v5e 240, v6e 560). Qwen3-30B-A3B's layer (bench/sweep_serving.py): v6e T256 1.39M
# -> 1.35M cycles, T512 1.46M -> 1.40M but v5e T512 2.47M -> 2.51M (floors), v6e T1024 1.52M ->
# 1.60M. Without the gathers and the scatter, v5e's static profile runs (it aborts on them).
ONEHOT_MAX_TOKENS = 256
DISPATCHES = ("onehot", "gather")


def route(x, router_w, *, top_k: int, scoring: str = "softmax", renormalize: bool = True):
    """(weights [T, top_k] f32 (f64 for f64 inputs), experts [T, top_k] int32). The experts are
    chosen on the logits: softmax and sigmoid are increasing, so they rank the experts alike and
    the choice does not depend on how the scores round."""
    acc = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    logits = jnp.dot(x, router_w, precision=jax.lax.Precision.HIGHEST, preferred_element_type=acc)
    _, experts = jax.lax.top_k(logits, top_k)
    scores = jax.nn.softmax(logits, axis=-1) if scoring == "softmax" else jax.nn.sigmoid(logits)
    # The chosen scores by a one-hot select over the few experts: a gather here (take_along_axis)
    # would make the TPU static profiler abort on v5e ("Unsupported DMA direction").
    chosen = experts[..., None] == jnp.arange(scores.shape[-1], dtype=experts.dtype)
    weights = jnp.sum(jnp.where(chosen, scores[:, None, :], 0), axis=-1)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def sort_pairs(experts, num_experts: int, weights=None):
    """(order, group_sizes, sorted_weights): the (token, expert) pairs (pair i = token i // top_k, its
    (i % top_k)-th expert) sorted by expert, stably, as sorted position -> pair; the pairs each expert
    gets, int32 [E]; and with `weights` [T, top_k] each sorted pair's weight (carried by the same
    sort; None without)."""
    flat = experts.reshape(-1)
    carried = (flat, jnp.arange(flat.shape[0], dtype=jnp.int32))
    if weights is not None:
        carried += (weights.reshape(-1),)
    out = jax.lax.sort(carried, num_keys=1, is_stable=True)
    group_sizes = jnp.sum(flat[:, None] == jnp.arange(num_experts, dtype=jnp.int32)[None, :], axis=0,
                          dtype=jnp.int32)
    return out[1], group_sizes, out[2] if weights is not None else None


def _check(x, router_w, w_gate, w_up, w_down, top_k, scoring, dispatch=None) -> None:
    """Shape and dtype errors, raised before anything is traced into a kernel."""
    if x.ndim != 2:
        raise ValueError(f"x must be [T, D], got shape {x.shape}")
    t, d = x.shape
    if router_w.ndim != 2 or router_w.shape[0] != d:
        raise ValueError(f"router_w must be [D={d}, E], got shape {router_w.shape}")
    e = router_w.shape[1]
    if w_gate.ndim != 3 or w_gate.shape[:2] != (e, d):
        raise ValueError(f"w_gate must be [E={e}, D={d}, F], got shape {w_gate.shape}")
    f = w_gate.shape[2]
    if w_up.shape != w_gate.shape:
        raise ValueError(f"w_up must be [E, D, F] = {w_gate.shape} like w_gate, got {w_up.shape}")
    if w_down.shape != (e, f, d):
        raise ValueError(f"w_down must be [E={e}, F={f}, D={d}], got shape {w_down.shape}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be between 1 and the {e} experts, got {top_k}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if dispatch is not None and dispatch not in DISPATCHES:
        raise ValueError(f"dispatch must be one of {DISPATCHES} or None, got {dispatch!r}")
    if min(t, d, f) == 0:
        raise ValueError(f"empty operand: x {x.shape}, experts [{e}, {d}, {f}]")
    dts = {jnp.dtype(a.dtype) for a in (x, w_gate, w_up, w_down)}
    if len(dts) != 1 or dts.pop() not in _DTYPES:
        raise ValueError(f"x and the expert weights must all be bfloat16 or all float32, got {x.dtype}, "
                         f"{w_gate.dtype}, {w_up.dtype}, {w_down.dtype}")


def inverse_permutation(order):
    """The inverse permutation, by a scatter. (A second argsort is a third of its static cycles on
    v6e at 16,384 rows, but with it the static-profile compile of the whole call runs out of VMEM.)"""
    return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))


def _tokens_of(order, top_k: int, t: int):
    """[P, T] bool: sorted pair s belongs to token t."""
    tok = order // top_k
    return tok[:, None] == jnp.arange(t, dtype=tok.dtype)[None, :]


def onehot_dispatch(x, order, top_k: int):
    """x's row for each sorted pair, as a [P, T] one-hot matmul (one non-zero term a row: exact)."""
    sel = _tokens_of(order, top_k, x.shape[0]).astype(x.dtype)
    hi = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    return jnp.dot(sel, x, precision=hi, preferred_element_type=jnp.float32).astype(x.dtype)


def onehot_combine(y, order, sorted_weights, top_k: int, t: int):
    """out [T, D] f32: each token's pairs' rows of y (sorted order) weighted and summed, as a [P, T]
    matmul contracted over P. bf16 y takes the f32 weights as two bf16 halves (16 significant bits);
    f32 y takes them whole at Precision.HIGHEST."""
    wt = jnp.where(_tokens_of(order, top_k, t), sorted_weights[:, None].astype(jnp.float32), 0.0)
    dims = (((0,), (0,)), ((), ()))
    if y.dtype == jnp.float32:
        return jax.lax.dot_general(wt, y, dims, precision=jax.lax.Precision.HIGHEST,
                                   preferred_element_type=jnp.float32)
    hi = wt.astype(y.dtype)
    lo = (wt - hi.astype(jnp.float32)).astype(y.dtype)
    return (jax.lax.dot_general(hi, y, dims, preferred_element_type=jnp.float32)
            + jax.lax.dot_general(lo, y, dims, preferred_element_type=jnp.float32))


def _experts(xs, w_gate, w_up, w_down, group_sizes, blocks: BlockSizes, interpret: bool):
    """The sorted rows through their experts: [M, D] -> [M, D], two grouped-matmul calls. The
    weights stay in HBM: XLA would otherwise prefetch a weight that fits VMEM there whole before the
    call (all E experts, where the kernel reads only the experts rows are routed to). They are padded
    to the blocks first: jax 0.12 refuses to pad an array pinned to a memory space."""
    p1 = make_plan(xs.shape, w_gate.shape, blocks.gate_up)
    s1 = make_schedule(group_sizes, m=p1.m, block_m=p1.bm, m_tiles=p1.m_tiles)
    shape1 = (p1.e, p1.kp, p1.np_)
    h = gmm_pallas(_pad_to(xs, (p1.mp, p1.kp)), keep_in_hbm(_pad_to(w_gate, shape1)), s1, bm=p1.bm, bk=p1.bk,
                   bn=p1.bn, cm=p1.cm, v_max=p1.v_max, transpose_rhs=False, out_dtype=xs.dtype, interpret=interpret,
                   up=keep_in_hbm(_pad_to(w_up, shape1)), name="fused_moe_gate_up")[:p1.m, :p1.n]
    p2 = make_plan(h.shape, w_down.shape, blocks.down)
    s2 = s1 if p2.bm == p1.bm and p2.m_tiles == p1.m_tiles else make_schedule(
        group_sizes, m=p2.m, block_m=p2.bm, m_tiles=p2.m_tiles)
    w_down = keep_in_hbm(_pad_to(w_down, (p2.e, p2.kp, p2.np_)))
    y = gmm_pallas(_pad_to(h, (p2.mp, p2.kp)), w_down, s2, bm=p2.bm, bk=p2.bk,
                   bn=p2.bn, cm=p2.cm, v_max=p2.v_max, transpose_rhs=False, out_dtype=xs.dtype,
                   interpret=interpret, name="fused_moe_down")
    return y[:p2.m, :p2.n]


@functools.partial(jax.jit, static_argnames=("top_k", "scoring", "renormalize", "block_sizes", "dispatch",
                                             "interpret"))
def fused_moe(x, router_w, w_gate, w_up, w_down, *, top_k: int, scoring: str = "softmax", renormalize: bool = True,
              block_sizes: BlockSizes | None = None, dispatch: str | None = None, interpret: bool = False):
    """A routed SwiGLU MoE layer: x [T, D] -> [T, D] (see the module docstring).

    x and the expert weights all bfloat16 or all float32; router_w [D, E] any float dtype.
    `scoring` "softmax" (Mixtral, Qwen3) or "sigmoid" (DeepSeek V3's scores); `renormalize` divides
    the chosen weights by their sum. `block_sizes` defaults to `default_blocks(D)`. `dispatch`
    "onehot" or "gather" moves the rows to and from expert order that way; None takes "onehot" up to
    `ONEHOT_MAX_TOKENS` tokens. `interpret=True` runs the Pallas interpreter (CPU).
    """
    _check(x, router_w, w_gate, w_up, w_down, top_k, scoring, dispatch)
    blocks = block_sizes or default_blocks(x.shape[1])
    t, d = x.shape
    e = router_w.shape[1]
    weights, experts = route(x, router_w, top_k=top_k, scoring=scoring, renormalize=renormalize)
    if (dispatch or ("onehot" if t <= ONEHOT_MAX_TOKENS else "gather")) == "onehot":
        order, group_sizes, sorted_weights = sort_pairs(experts, e, weights)
        # In a matmul 0 x inf is NaN, so one token's non-finite element would reach every token of the
        # batch: such a token goes through the experts as zeros and its output row is NaN (the gathers
        # give it a non-finite row too), while the others' are untouched.
        bad = ~jnp.all(jnp.isfinite(x), axis=1, keepdims=True)
        xs = onehot_dispatch(jnp.where(bad, jnp.zeros((), x.dtype), x), order, top_k)
        y = _experts(xs, w_gate, w_up, w_down, group_sizes, blocks, interpret)
        return jnp.where(bad, jnp.nan, onehot_combine(y, order, sorted_weights, top_k, t)).astype(x.dtype)
    order, group_sizes, _ = sort_pairs(experts, e)
    # (On v5e the TPU static profiler aborts on these row gathers and the scatter, "Unsupported DMA
    # direction"; pinning their operands to HBM does not help there and fails to trace on jax 0.12.)
    y = _experts(x[order // top_k], w_gate, w_up, w_down, group_sizes, blocks, interpret)
    where = inverse_permutation(order)  # pair -> sorted position
    per_pair = y[where].reshape(t, top_k, d).astype(weights.dtype)
    return jnp.einsum("tk,tkd->td", weights, per_pair).astype(x.dtype)


@functools.partial(jax.jit, static_argnames=("top_k", "scoring", "renormalize"))
def reference(x, router_w, w_gate, w_up, w_down, *, top_k: int, scoring: str = "softmax", renormalize: bool = True):
    """Pure JAX, the dense dispatch: every expert on every token, each token keeping its top_k
    experts' outputs weighted by the routing (E / top_k times the useful FLOPs). silu(g) * u is
    rounded to x's dtype before the down matmul, as the kernel stores it. Runs in float64 under
    jax.enable_x64()."""
    acc = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    hi = jax.lax.Precision.HIGHEST
    weights, experts = route(x, router_w, top_k=top_k, scoring=scoring, renormalize=renormalize)
    e = router_w.shape[1]
    combine = jnp.sum(jax.nn.one_hot(experts, e, dtype=acc) * weights[..., None].astype(acc), axis=1)  # [T, E]
    g = jnp.einsum("td,edf->etf", x, w_gate, precision=hi, preferred_element_type=acc)
    u = jnp.einsum("td,edf->etf", x, w_up, precision=hi, preferred_element_type=acc)
    h = (jax.nn.silu(g) * u).astype(x.dtype)
    y = jnp.einsum("etf,efd->etd", h, w_down, precision=hi, preferred_element_type=acc)
    return jnp.einsum("te,etd->td", combine, y, precision=hi).astype(x.dtype)


def megablox_moe(x, router_w, w_gate, w_up, w_down, *, top_k: int, scoring: str = "softmax",
                 renormalize: bool = True):
    """The routed MoE as MaxText's sparse-matmul path writes it with JAX's own kernel: the same
    routing and sort, then JAX's megablox `gmm` for gate, up and down, the SwiGLU and the combine in
    XLA between them."""
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    t, d = x.shape
    e = router_w.shape[1]
    weights, experts = route(x, router_w, top_k=top_k, scoring=scoring, renormalize=renormalize)
    order, group_sizes, _ = sort_pairs(experts, e)
    xs = x[order // top_k]
    m = xs.shape[0]
    tiling = (min(512, m), min(512, d), min(512, w_gate.shape[2]))
    g = gmm(xs, w_gate, group_sizes, preferred_element_type=x.dtype, tiling=tiling)
    u = gmm(xs, w_up, group_sizes, preferred_element_type=x.dtype, tiling=tiling)
    h = (jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(x.dtype)
    y = gmm(h, w_down, group_sizes, preferred_element_type=x.dtype, tiling=(min(512, m), min(512, h.shape[1]),
                                                                            min(512, d)))
    where = inverse_permutation(order)
    per_pair = y[where].reshape(t, top_k, d).astype(jnp.float32)
    return jnp.einsum("tk,tkd->td", weights, per_pair).astype(x.dtype)


# ------------------------------------------------------------------------------------ verify, bench
def _make(t, d, f, e, dtype, *, tied_router: bool = False):
    """make_args: x and router_w hold small multiples of 1/4 and 1/16, so the logits are exact in
    f32 and f64 alike and the routing (equal logits included: they occur) is the same in the kernel
    and both reference runs; the expert weights are random normals scaled to unit-size outputs.
    `tied_router`: expert 1's router column is expert 0's, a tie in every token's scores."""
    def make(key):
        ks = jax.random.split(key, 5)
        x = (jax.random.randint(ks[0], (t, d), -4, 5) / 4).astype(dtype)
        r = jax.random.randint(ks[1], (d, e), -8, 9) / 16
        if tied_router:
            r = r.at[:, 1].set(r[:, 0])
        w = [(jax.random.normal(k, shape, jnp.float32) / shape[1] ** 0.5).astype(dtype)
             for k, shape in zip(ks[2:], ((e, d, f), (e, d, f), (e, f, d)))]
        return (x, r.astype(jnp.float32), *w)
    return make


def cases() -> list[Case]:
    # Small tiles so a few dozen rows make several row tiles, groups split across tiles, and both
    # contraction and column blocks; cases that share shapes share compiled interpret programs.
    small = {"block_sizes": BlockSizes(GmmBlocks(block_m=32, block_k=128, block_n=128, compute_m=16),
                                       GmmBlocks(block_m=32, block_k=128, block_n=128, compute_m=16))}
    gathered = {"block_sizes": small["block_sizes"], "dispatch": "gather"}
    f32, bf16 = jnp.float32, jnp.bfloat16
    # The cases' few tokens take the one-hot dispatch by default; two take the gathers too.
    return [
        Case("f32 top-2 of 8, softmax renormalized, K in 2 blocks (accumulators)",
             _make(40, 256, 256, 8, f32), {"top_k": 2}, "float32", kernel_params=small),
        Case("bf16 top-2 of 8, softmax renormalized (Mixtral)", _make(40, 256, 256, 8, bf16), {"top_k": 2},
             "bfloat16", kernel_params=small),
        # 24 tokens x 4 = 96 rows over 16 experts: several experts empty, groups of a few rows.
        Case("bf16 top-4 of 16, sigmoid without renormalization, empty experts",
             _make(24, 128, 256, 16, bf16), {"top_k": 4, "scoring": "sigmoid", "renormalize": False}, "bfloat16",
             kernel_params=small),
        Case("bf16 tied router columns (experts 0 and 1 score alike for every token)",
             _make(24, 128, 256, 16, bf16, tied_router=True), {"top_k": 4}, "bfloat16", kernel_params=small),
        # D and F off the 128 lanes: the expert calls pad; T=7 rows, one token each of top-1.
        Case("f32 top-1, D 96 and F 200 off the lanes, 7 tokens", _make(7, 96, 200, 4, f32), {"top_k": 1},
             "float32", kernel_params=small),
        Case("bf16 default blocks on a small shape", _make(16, 128, 128, 8, bf16), {"top_k": 2}, "bfloat16"),
        Case("bf16 top-2 of 8, rows moved by gathers", _make(40, 256, 256, 8, bf16), {"top_k": 2}, "bfloat16",
             kernel_params=gathered),
        Case("f32 top-1, D 96 and F 200 off the lanes, rows moved by gathers", _make(7, 96, 200, 4, f32),
             {"top_k": 1}, "float32", kernel_params=gathered),
    ]


TOLERANCES = {
    "float32": Tolerance(5e-4, 1e-5, "f32 MXU passes (Precision.HIGHEST) accumulated in f32: summation order "
                         "alone differs from the reference by ~1e-6 relative to sum|terms| over contractions of "
                         "<= 256 and top_k <= 4 experts; 10x headroom"),
    "bfloat16": Tolerance(4e-2, 2e-2, "silu(g) * u is rounded to bf16 (2^-9 relative) before the down matmul and "
                          "the output to bf16 (2^-9): kernel and reference round the same f32 values, but may "
                          "land on neighbouring bf16s, and against float64 the rounded intermediate carries "
                          "~2^-9 relative error through a unit-variance contraction of <= 256 terms"),
}


def _prod_args(p: dict):
    sds = jax.ShapeDtypeStruct
    return (sds((p["tokens"], p["d"]), jnp.bfloat16), sds((p["d"], p["e"]), jnp.bfloat16),
            sds((p["e"], p["d"], p["f"]), jnp.bfloat16), sds((p["e"], p["d"], p["f"]), jnp.bfloat16),
            sds((p["e"], p["f"], p["d"]), jnp.bfloat16))


def bench(blocks: BlockSizes | None = None, shape: dict | None = None) -> BenchSetup:
    """At Qwen3-30B-A3B's MoE over 2048 tokens by default; `shape` replaces fields of PROD (`tokens`,
    or another model's `d`, `f`, `e`, `top_k`)."""
    p = at_shape(PROD, shape)
    blocks = blocks or default_blocks(p["d"])
    k = p["top_k"]

    def kernel(x, r, wg, wu, wd):
        return fused_moe(x, r, wg, wu, wd, top_k=k, block_sizes=blocks)

    def xla(x, r, wg, wu, wd):
        return reference(x, r, wg, wu, wd, top_k=k)

    def jax_kernel(x, r, wg, wu, wd):
        return megablox_moe(x, r, wg, wu, wd, top_k=k)

    shape_text = TUNED_FOR if not shape else (f"T{p['tokens']} D{p['d']} F{p['f']} E{p['e']} top-{k} softmax "
                                              f"renormalized, bf16")
    return BenchSetup(shape=shape_text, args=_prod_args(p), kernel=kernel, xla=xla, jax_kernel=jax_kernel,
                      jax_name="megablox gmm x3 (MaxText's sparse-matmul route, tiling 512)", blocks=blocks.text())


SPEC = KernelSpec(
    name="fused_moe",
    title="Routed SwiGLU MoE in one call: top-k routing, token sort, grouped gate/up/down, combine",
    replaces=("Without it a port dispatches densely (every expert on every token, masked by a one-hot: E/top_k "
              "times the useful FLOPs, 16x for Qwen3's top-8 of 128) or sorts and calls three grouped matmuls "
              "with gate, up and the SwiGLU through HBM between them."),
    signature=("fused_moe(x, router_w, w_gate, w_up, w_down, *, top_k, scoring='softmax', renormalize=True, "
               "block_sizes=None, dispatch=None, interpret=False)"),
    tuned_for=TUNED_FOR,
    usage=("from tpudiag.kernels.fused_moe import fused_moe\n"
           "# x [T, D] bf16, router_w [D, E], w_gate and w_up [E, D, F], w_down [E, F, D] bf16\n"
           "out = fused_moe(x, router_w, w_gate, w_up, w_down, top_k=8)  # [T, D]"),
    kernel=fused_moe,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=(
        BlockSizes(),
        BlockSizes(GmmBlocks(512, 2048, 768, 128), GmmBlocks(512, 768, 2048, 128)),
        BlockSizes(GmmBlocks(128, 2048, 768, 128), GmmBlocks(128, 768, 2048, 128)),
        BlockSizes(GmmBlocks(256, 2048, 768, 64), GmmBlocks(256, 768, 1024, 64)),
        BlockSizes(GmmBlocks(256, 1024, 768, 128), GmmBlocks(256, 768, 1024, 128)),
        BlockSizes(GmmBlocks(128, 2048, 768, 32), GmmBlocks(128, 768, 2048, 32)),
    ),
    differentiable=False,
)
