"""Softmax cross-entropy over a large vocabulary without materializing the probability matrix.

Reads logits [N, V] (bf16 or f32) and integer labels [N]; returns the per-row loss f32 [N],
loss[i] = logsumexp(logits[i]) - logits[i, labels[i]]. A row whose label is negative is ignored
(the usual padding convention): its loss and its gradient are 0. Labels >= V are not checked
(a kernel cannot raise on device); their loss is meaningless.
Differentiable in the logits (`jax.custom_vjp` with a Pallas backward kernel). This module holds
the Pallas TPU kernels, the pure-JAX reference, the plain-JAX version users write, and the `SPEC`
that `verify.py` and `bench.py` read. It does not autotune: `bench/sweep_cross_entropy.py` chose
the default blocks.

Why: `-jax.nn.log_softmax(logits.astype(f32))[labels]` makes XLA write an f32 copy of the logits
(or of the log-probabilities) to HBM and read it back: at N 2048 x V 128k bf16 that is 2.7 GB of
HBM traffic where reading the logits once is 0.54 GB (TPU-NOTES). The forward here reads the
logits once; the backward reads them once more and writes dlogits once.

Design:
- Forward: grid (row blocks, vocab blocks), the vocab axis last and sequential. Per row and per
  lane (column mod 128) it keeps a running max m and a running sum l of exp(x - m) in VMEM scratch
  (online log-sum-exp, rescaled by exp(m_old - m_new) when the max grows), and picks the label's
  logit out of whichever vocab block holds it with an iota compare; the 128 lanes of a row are
  combined once, after its last block. It is VPU-bound (~9 VALU ops per f32 vreg) just above the
  HBM floor on v5e. Outputs per row: loss, m and log(l). The loss is formed as
  (m - x[label]) + log(l), not lse - x[label]: at logits of 1e4 one f32 ulp of lse is 1e-3, while
  m - x[label] is rounded relative to itself and log(l) <= log(V) is small, so the loss keeps its
  relative accuracy.
- Backward: dlogits = (exp((x - m) - log l) - onehot(label)) * g, blockwise and fully parallel,
  written in the logits dtype. Saving m and log(l) (not their sum) keeps softmax accurate at
  large logit magnitudes for the same reason.
- V not a multiple of the vocab block: the last block reads past the end of the row; the forward
  masks those columns to -inf (only in the last block, so the other blocks pay nothing), the
  backward's writes there are dropped by Pallas. N not a multiple of the row block: rows past N
  compute garbage that is never written back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels.spec import BenchSetup, Case, KernelSpec, Tolerance
from tpudiag.kernels.tiling import block_bytes, fit_block, vmem_limit

# Production shape the default blocks were chosen at: a 2k-token batch of a 128k-vocab LM head.
PROD = dict(rows=2048, vocab=131072, dtype="bfloat16")


@dataclass(frozen=True)
class BlockSizes:
    """Block shape (rows x vocab columns) of the forward and backward kernels.

    Rows must be a multiple of 16 (bf16 packs 16 rows per 8-sublane vreg, f32 takes 8) and vocab
    columns a multiple of 128 (the VPU is 8 x 128 lanes). Blocks larger than the array are clipped to
    it. Larger blocks mean fewer grid steps (~0.35 us each) and longer DMAs; the cap is VMEM: two
    input buffers plus the f32 temporaries of one block.
    """

    # Chosen by bench/sweep_cross_entropy.py on v5e at N2048 V128k bf16 (see SPEC.tuned_for): the
    # forward is VPU-bound near the HBM floor, so larger blocks win by amortizing the ~600-cycle
    # grid step; the backward is HBM-bound already at 256 x 2048 (static 1.34M < floor 1.97M cycles)
    # and writes as much as it reads, so it keeps the smaller block.
    block_rows: int = 512
    block_vocab: int = 4096
    block_rows_bwd: int = 256
    block_vocab_bwd: int = 2048

    def __post_init__(self):
        for name in ("block_rows", "block_rows_bwd"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v % 16:
                raise ValueError(f"{name} must be a positive multiple of 16 (bf16 sublane packing), got {v!r}")
        for name in ("block_vocab", "block_vocab_bwd"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 128 or v % 128:
                raise ValueError(f"{name} must be a positive multiple of 128 (TPU lane width), got {v!r}")

    def __str__(self) -> str:
        return (f"block_rows={self.block_rows}, block_vocab={self.block_vocab}, "
                f"block_rows_bwd={self.block_rows_bwd}, block_vocab_bwd={self.block_vocab_bwd}")


DEFAULT_BLOCKS = BlockSizes()


def _check_inputs(logits, labels):
    """Shape and dtype errors as ValueError, before any kernel is traced."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {logits.shape}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"logits must be non-empty, got shape {logits.shape}")
    if labels.shape != (logits.shape[0],):
        raise ValueError(f"labels must be [rows={logits.shape[0]}], got shape {labels.shape}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"labels must be integers, got {labels.dtype}")


# ----------------------------------------------------------------------------------------------
# forward

# Two row groups per loop iteration: lets the scheduler overlap one group's exp latency with the
# next group's loads (v5e static profile at 256 x 2048 blocks: 1.55M -> 1.37M cycles). Interpret
# mode keeps the loop rolled: the same operations in the same order, a smaller program to compile.
_UNROLL = 2


def _tree(op, xs):
    """Pairwise reduction: depth log2(len) instead of len."""
    while len(xs) > 1:
        xs = [op(xs[k], xs[k + 1]) if k + 1 < len(xs) else xs[k] for k in range(0, len(xs), 2)]
    return xs[0]


def _row_group(bn: int) -> int:
    # 16 rows = one packed bf16 vreg (two f32 vregs) per 128 lanes; a block smaller than that (only
    # when it is the whole, small array) is one group.
    for g in (16, 8):
        if bn % g == 0:
            return g
    return bn


def cross_entropy_fwd_kernel(labels_ref, x_ref, loss_ref, m_out_ref, logl_out_ref, m_ref, l_ref, t_ref,
                             *, vocab: int, block_vocab: int, row_group: int, lane_chunk: int, unroll: int):
    """Grid step (row block i, vocab block j).

    labels_ref [bn, 1] int32; x_ref [bn, bv] logits; loss_ref/m_out_ref/logl_out_ref [bn, 1] f32,
    resident across j and written at the last j. m_ref, l_ref, t_ref [bn, lane_chunk] f32 VMEM
    scratch, one running max / sum of exp(x - m) / label logit per row *and lane*: the block is
    walked in [row_group, lane_chunk] tiles (one or two vregs), folded elementwise into that
    per-lane state, so the loop does no cross-lane (XLU) work and keeps no block-sized f32
    temporary (which Mosaic would spill to VMEM: the vector-store slot, one per bundle, was the
    bottleneck of the whole-block version). Lanes are combined once per row, at the last j.
    """
    j = pl.program_id(1)
    last = pl.num_programs(1) - 1
    bn, bv = x_ref.shape
    n_chunks = bv // lane_chunk
    tail = vocab - (pl.cdiv(vocab, block_vocab) - 1) * block_vocab  # real columns in the last block

    first = j == 0

    def update(valid_cols: int):
        """Fold this block's first `valid_cols` columns (static) into the state of every row group."""
        chunks = [c for c in range(n_chunks) if c * lane_chunk < valid_cols]
        lane = lax.broadcasted_iota(jnp.int32, (row_group, lane_chunk), 1)

        def load(rows, c):
            # f32 math: v5e's VPU and EUP have no bf16, and bf16 sums over 128k terms drift by >1e-2.
            x = x_ref[rows, pl.ds(c * lane_chunk, lane_chunk)].astype(jnp.float32)
            if (c + 1) * lane_chunk > valid_cols:  # columns past V hold whatever the DMA left there
                x = jnp.where(lane < valid_cols - c * lane_chunk, x, -jnp.inf)
            return x

        def group(g, carry):
            rows = pl.ds(pl.multiple_of(g * row_group, row_group), row_group)
            # State starts at the first vocab block here rather than in a separate init pass over
            # the scratch (one select per state vreg instead of a store per state vreg). The most
            # negative finite f32, not -inf: m_old - m_new and x - m_new then never see inf - inf,
            # even in a lane that has met only masked (-inf) columns so far.
            m_old = jnp.where(first, jnp.finfo(jnp.float32).min, m_ref[rows, :])
            l_old = jnp.where(first, 0.0, l_ref[rows, :])
            t_old = jnp.where(first, 0.0, t_ref[rows, :])
            # pass 1: lane-wise max, straight from the input buffer; a tree, not a chain, so the
            # VALU slots are not left waiting on each max's latency.
            m_new = jnp.maximum(m_old, _tree(jnp.maximum, [load(rows, c) for c in chunks]))
            # The label in this block's lane coordinates, broadcast across lanes once per group.
            lab = jnp.broadcast_to(labels_ref[rows, :] - j * block_vocab, (row_group, lane_chunk))
            es, ts = [], []
            for c in chunks:  # pass 2: re-read (VMEM loads are cheap; stores are not)
                x = load(rows, c)
                es.append(jnp.exp(x - m_new))
                ts.append(jnp.where(lane == lab - c * lane_chunk, x, 0.0))
            m_ref[rows, :] = m_new
            l_ref[rows, :] = l_old * jnp.exp(m_old - m_new) + _tree(jnp.add, es)
            t_ref[rows, :] = t_old + _tree(jnp.add, ts)
            return carry

        lax.fori_loop(0, bn // row_group, group, 0, unroll=unroll)

    if tail != block_vocab:
        pl.when(j < last)(lambda: update(bv))
        pl.when(j == last)(lambda: update(tail))
    else:
        update(bv)

    @pl.when(j == last)
    def _():
        m_lane = m_ref[...]
        m = jnp.max(m_lane, axis=1, keepdims=True)
        logl = jnp.log(jnp.sum(l_ref[...] * jnp.exp(m_lane - m), axis=1, keepdims=True))
        t = jnp.sum(t_ref[...], axis=1, keepdims=True)
        loss_ref[...] = jnp.where(labels_ref[...] >= 0, (m - t) + logl, 0.0)
        m_out_ref[...] = m
        logl_out_ref[...] = logl


def _fwd_call(logits, labels, blocks: BlockSizes, interpret: bool):
    n, v = logits.shape
    bn, bv = fit_block(blocks.block_rows, n), fit_block(blocks.block_vocab, v)
    grid = (pl.cdiv(n, bn), pl.cdiv(v, bv))
    row_spec = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    out_shape = [jax.ShapeDtypeStruct((n, 1), jnp.float32)] * 3
    nbytes = n * v * logits.dtype.itemsize + 4 * n * 4  # logits once; labels in; loss, m, log l out
    # bv is a multiple of 128 unless it is the whole (small) vocabulary: then one chunk of all of it.
    lane_chunk = 128 if bv % 128 == 0 else bv
    # labels in, loss/m/log l out: four [bn, 1] columns (32-bit) beside the logits block
    vmem = vmem_limit(4 * block_bytes((bn, 1), 4) + block_bytes((bn, bv), logits.dtype.itemsize),
                      scratch=3 * block_bytes((bn, lane_chunk), 4))
    loss, m, logl = pl.pallas_call(
        functools.partial(cross_entropy_fwd_kernel, vocab=v, block_vocab=bv, row_group=_row_group(bn),
                          lane_chunk=lane_chunk, unroll=1 if interpret else _UNROLL),
        grid=grid,
        in_specs=[row_spec, pl.BlockSpec((bn, bv), lambda i, j: (i, j))],
        out_specs=[row_spec] * 3,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((bn, lane_chunk), jnp.float32)] * 3,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=vmem),
        # max, subtract, exp-sum, compare, select, add per element; one exp per element
        cost_estimate=pl.CostEstimate(flops=6 * n * v, transcendentals=n * v, bytes_accessed=nbytes),
        interpret=interpret,
        name="cross_entropy_fwd",
    )(labels.reshape(n, 1).astype(jnp.int32), logits)
    return loss[:, 0], m, logl


# ----------------------------------------------------------------------------------------------
# backward


def cross_entropy_bwd_kernel(labels_ref, m_ref, logl_ref, g_ref, x_ref, dx_ref, *, block_vocab: int):
    """Grid step (row block i, vocab block j): dx = (softmax(x) - onehot(label)) * g, in x's dtype."""
    j = pl.program_id(1)
    x = x_ref[...].astype(jnp.float32)
    p = jnp.exp((x - m_ref[...]) - logl_ref[...])
    labels = labels_ref[...]
    cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    g = jnp.where(labels >= 0, g_ref[...], 0.0)  # ignored rows get no gradient
    dx_ref[...] = ((p - jnp.where(cols == labels - j * block_vocab, 1.0, 0.0)) * g).astype(dx_ref.dtype)


def _bwd_call(logits, labels, m, logl, g, blocks: BlockSizes, interpret: bool):
    n, v = logits.shape
    bn, bv = fit_block(blocks.block_rows_bwd, n), fit_block(blocks.block_vocab_bwd, v)
    row_spec = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    blk_spec = pl.BlockSpec((bn, bv), lambda i, j: (i, j))
    nbytes = 2 * n * v * logits.dtype.itemsize + 4 * n * 4  # logits in, dlogits out; 4 row vectors in
    vmem = vmem_limit(4 * block_bytes((bn, 1), 4) + 2 * block_bytes((bn, bv), logits.dtype.itemsize))
    return pl.pallas_call(
        functools.partial(cross_entropy_bwd_kernel, block_vocab=bv),
        grid=(pl.cdiv(n, bn), pl.cdiv(v, bv)),
        in_specs=[row_spec, row_spec, row_spec, row_spec, blk_spec],
        out_specs=blk_spec,
        out_shape=jax.ShapeDtypeStruct((n, v), logits.dtype),
        # Every block is independent: both axes parallel (split across v5p/v4 megacore TensorCores).
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"), vmem_limit_bytes=vmem),
        cost_estimate=pl.CostEstimate(flops=6 * n * v, transcendentals=n * v, bytes_accessed=nbytes),
        interpret=interpret,
        name="cross_entropy_bwd",
    )(labels.reshape(n, 1).astype(jnp.int32), m, logl, g.reshape(n, 1).astype(jnp.float32), logits)


# ----------------------------------------------------------------------------------------------
# public wrapper


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _xent(logits, labels, blocks, interpret):
    return _fwd_call(logits, labels, blocks, interpret)[0]


def _xent_fwd(logits, labels, blocks, interpret):
    loss, m, logl = _fwd_call(logits, labels, blocks, interpret)
    return loss, (logits, labels, m, logl)


def _xent_bwd(blocks, interpret, res, g):
    logits, labels, m, logl = res
    dlogits = _bwd_call(logits, labels, m, logl, g, blocks, interpret)
    # Integer labels take a float0 cotangent.
    return dlogits, np.zeros(labels.shape, jax.dtypes.float0)


_xent.defvjp(_xent_fwd, _xent_bwd)


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def cross_entropy(logits, labels, *, block_sizes: BlockSizes | None = None, interpret: bool = False):
    """Per-row softmax cross-entropy f32 [N] of logits [N, V] at integer labels [N] (label < 0: loss 0).

    Differentiable in `logits`; dlogits comes back in the logits' dtype.
    """
    _check_inputs(logits, labels)
    blocks = DEFAULT_BLOCKS if block_sizes is None else block_sizes
    if not isinstance(blocks, BlockSizes):
        raise ValueError(f"block_sizes must be a cross_entropy.BlockSizes, got {type(blocks).__name__}")
    return _xent(logits, labels, blocks, interpret)


# ----------------------------------------------------------------------------------------------
# reference and the plain-JAX version


@jax.jit
def reference(logits, labels):
    """Pure JAX: the same loss through jax.nn.log_softmax; float64 in, float64 out.

    Jitted only so that verify compiles it once per case rather than op by op."""
    x = logits if logits.dtype == jnp.float64 else logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(x, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.clip(labels, 0, x.shape[1] - 1)[:, None], axis=-1)[:, 0]
    return jnp.where(labels >= 0, -picked, 0.0)


def xla_cross_entropy(logits, labels):
    """What users write without a kernel: f32 log-softmax, gathered at the labels."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


# ----------------------------------------------------------------------------------------------
# verify cases and bench


def _case_args(n, v, dtype, scale=3.0, ignored=0):
    def make(key):
        k1, k2 = jax.random.split(key)
        logits = (scale * jax.random.normal(k1, (n, v), jnp.float32)).astype(dtype)
        labels = jax.random.randint(k2, (n,), 0, v, jnp.int32)
        if ignored:
            labels = labels.at[:ignored].set(-1)
        return logits, labels
    return make


def _blocks(rows, vocab):
    return BlockSizes(block_rows=rows, block_vocab=vocab, block_rows_bwd=rows, block_vocab_bwd=vocab)


def cases() -> list[Case]:
    # Few grid steps per case: interpret mode costs ~0.1 s of tracing per grid step on CPU.
    return [
        Case("f32 N40 V1000: neither a block multiple", _case_args(40, 1000, jnp.float32),
             dict(block_sizes=_blocks(32, 384)), "float32", grad=True),
        Case("bf16 N24 V777: neither a block multiple", _case_args(24, 777, jnp.bfloat16),
             dict(block_sizes=_blocks(16, 512)), "bfloat16", grad=True),
        Case("f32 logits at scale 1e4, 5 ignored rows (label -1)",
             _case_args(16, 640, jnp.float32, scale=1e4, ignored=5),
             dict(block_sizes=_blocks(16, 256)), "float32", grad=True),
        Case("bf16 logits at scale 1e3", _case_args(16, 512, jnp.bfloat16, scale=1e3),
             dict(block_sizes=_blocks(16, 256)), "bfloat16", grad=True),
        Case("f32 default blocks, V300 smaller than one block", _case_args(8, 300, jnp.float32), {}, "float32",
             grad=True),
    ]


TOLERANCES = {
    "float32": Tolerance(2e-5, 2e-5, "f32 math in both; the sum of exp over V terms in a different "
                                     "order moves log(l) by ~1e-6, the loss keeps relative accuracy "
                                     "because m - x[label] is exact"),
    "bfloat16": Tolerance(2e-5, 2e-5, "bf16 logits are exact in f32 and the loss is f32 math, so the "
                                      "forward is as accurate as for f32 inputs"),
    "float32.grad": Tolerance(1e-6, 1e-4, "softmax from the saved m and log(l) in f32: ~1e-6 relative "
                                          "error in log(l) becomes the same relative error in each entry"),
    "bfloat16.grad": Tolerance(1e-6, 1e-2, "dlogits are written in bf16 (2^-8 relative ulp): kernel and "
                                           "reference may round the same value to adjacent bf16 numbers"),
}

# The sweep varies the forward block; the backward stays at 256 x 2048 (HBM-bound there).
BLOCK_CANDIDATES = tuple(BlockSizes(r, v, 256, 2048) for r, v in (
    (256, 2048), (256, 4096), (512, 2048), (512, 4096), (256, 8192), (1024, 4096)))


def bench(blocks: BlockSizes | None = None) -> BenchSetup:
    blocks = DEFAULT_BLOCKS if blocks is None else blocks
    n, v = PROD["rows"], PROD["vocab"]
    args = (jax.ShapeDtypeStruct((n, v), jnp.bfloat16), jax.ShapeDtypeStruct((n,), jnp.int32))
    return BenchSetup(
        shape=f"N{n} V{v} bf16 logits, int32 labels (forward)",
        args=args,
        kernel=functools.partial(cross_entropy, block_sizes=blocks, interpret=False),
        xla=xla_cross_entropy,
        blocks=str(blocks),
    )


def grad_bench(blocks: BlockSizes | None = None) -> BenchSetup:
    """The loss plus its gradient (forward + backward), for bench/sweep_cross_entropy.py."""
    blocks = DEFAULT_BLOCKS if blocks is None else blocks
    n, v = PROD["rows"], PROD["vocab"]
    args = (jax.ShapeDtypeStruct((n, v), jnp.bfloat16), jax.ShapeDtypeStruct((n,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.float32))

    def vjp_of(fn):
        def run(logits, labels, g):
            loss, pullback = jax.vjp(lambda x: fn(x, labels), logits)
            return loss, pullback(g)[0]
        return run

    return BenchSetup(shape=f"N{n} V{v} bf16 logits (loss and dlogits)", args=args,
                      kernel=vjp_of(functools.partial(cross_entropy, block_sizes=blocks)),
                      xla=vjp_of(xla_cross_entropy), blocks=str(blocks))


SPEC = KernelSpec(
    name="cross_entropy",
    title="Softmax cross-entropy over a large vocabulary, online log-sum-exp, never writes probabilities",
    replaces="-log_softmax(logits.astype(f32))[labels]: XLA writes an f32 copy of the [N, V] logits and "
             "reads it back (2.7 GB at N2048 x V128k bf16 against 0.54 GB for one read of the logits); "
             "its gradient moves 2.1 GB where one read plus one write of dlogits is 1.07 GB",
    signature="cross_entropy(logits, labels, *, block_sizes=None, interpret=False) -> loss f32[N]",
    tuned_for="N2048 V131072 bf16 logits (forward on v5e and v6e)",
    usage="from tpudiag.kernels.cross_entropy import cross_entropy\n"
          "loss = cross_entropy(logits, labels).mean()  # logits [N, V] bf16, labels [N] int32 (-1: ignore)\n"
          "grads = jax.grad(lambda x: cross_entropy(x, labels).mean())(logits)",
    kernel=cross_entropy,
    reference=reference,
    cases=cases,
    tolerances=TOLERANCES,
    bench=bench,
    block_candidates=BLOCK_CANDIDATES,
    differentiable=True,
)
