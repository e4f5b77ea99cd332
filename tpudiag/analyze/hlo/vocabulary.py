"""The HLO opcode vocabulary: every opcode set the analyses share, defined once.

Reads nothing and computes nothing: frozensets of opcode spellings as XLA prints them
(`HloOpcodeString`, xla/hlo/ir/hlo_opcode.h: `opt-barrier`, `exponential`, `popcnt`), and the
custom-call target prefixes that are matmuls. Classification, costing and byte counting live in
the modules that import these (`categories`, `cost`, `collectives`, `dataflow`, `fusions`, ...).

Async collectives appear in two spellings. XLA has its own opcodes for all-reduce, all-gather and
collective-permute (`all-gather-start` / `all-gather-done`); every other collective runs
asynchronously as `async-start`/`async-done` wrapping it, which XLA's printer writes, and its parser
reads, as `<wrapped opcode>-start` / `-update` / `-done` (`reduce-scatter-start`,
`all-to-all-done`). Both spellings are in COLLECTIVE.
"""

from __future__ import annotations

# -- collectives ----------------------------------------------------------------------------------

# The collective kinds, as the base opcode of the sync form.
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
                    "collective-permute", "collective-broadcast")
# The kinds with async opcodes of their own (-start/-done, no -update); the others run async only
# inside the generic wrapper.
_OWN_ASYNC_KINDS = ("all-reduce", "all-gather", "collective-permute")
# The -start halves of async collectives: the instruction that carries the transfer.
COLLECTIVE_START = frozenset(f"{k}-start" for k in COLLECTIVE_KINDS)
# The -update/-done halves: they wait for (or poll) the transfer their -start began.
COLLECTIVE_UPDATE = frozenset(f"{k}-update" for k in COLLECTIVE_KINDS if k not in _OWN_ASYNC_KINDS)
COLLECTIVE_DONE = frozenset(f"{k}-done" for k in COLLECTIVE_KINDS)
COLLECTIVE = frozenset(COLLECTIVE_KINDS) | COLLECTIVE_START | COLLECTIVE_UPDATE | COLLECTIVE_DONE
# Async starts whose shape is (operands, results, context...): all-reduce-start's is its result alone.
COLLECTIVE_START_TUPLE = COLLECTIVE_START - {"all-reduce-start"}
# Point-to-point transfers: a collective between devices, or a host transfer (`is_host_transfer`).
# The -start-like halves carry the transfer (its bytes leave the device); the -done halves wait for it.
SEND_RECV_START = frozenset({"send", "recv"})
SEND_RECV = SEND_RECV_START | frozenset({"send-done", "recv-done"})
# The instructions whose called computations can hold a collective: XLA's async wrapper, a TPU
# collective fusion, and a call (`collectives.collective_instruction` looks inside all three).
COLLECTIVE_WRAPPERS = frozenset({"async-start", "fusion", "call"})
# The same less `call`, on purpose: an op row's ICI bytes count the collectives inside it
# (`compile/report.py`), and a call's callee is an executed computation whose collectives are op
# rows of their own; opening calls too would count them twice.
COLLECTIVE_OP_WRAPPERS = COLLECTIVE_WRAPPERS - {"call"}


def collective_kind(opcode: str) -> str | None:
    """`all-gather-start`, `reduce-scatter-done`, `all-reduce` -> its collective kind; None for any
    other opcode."""
    if opcode not in COLLECTIVE:
        return None
    for suffix in ("-start", "-update", "-done"):
        if opcode.endswith(suffix):
            opcode = opcode[:-len(suffix)]
            break
    return opcode


# -- async pairs ----------------------------------------------------------------------------------

# The generic async wrapper (its called computation holds the op it runs).
ASYNC = frozenset({"async-start", "async-update", "async-done"})
# The waiting halves of every async pair: their transfer or copy is the -start's.
ASYNC_DONE = COLLECTIVE_DONE | COLLECTIVE_UPDATE | frozenset({
    "async-done", "async-update", "copy-done", "send-done", "recv-done",
})

# An asynchronous copy's two halves (a prefetch into VMEM, a buffer moved between memories).
ASYNC_COPY = frozenset({"copy-start", "copy-done"})
# Every copy, sync or either async half: its value is its operand's (a layout or memory-space change
# is physical only), so a value's source is followed back through any of them.
COPIES = frozenset({"copy"}) | ASYNC_COPY
# The copies that move the bytes (a copy-done only waits for its start): their VMEM side never
# touches HBM (`compile/report.py` counts only their HBM side).
COPY_MOVES = frozenset({"copy", "copy-start"})
# Async starts that can move a buffer between HBM and host memory (activation offload:
# `compile/host_transfers.py`).
HOST_TRANSFER_STARTS = frozenset({"dynamic-update-slice-start", "dynamic-slice-start", "copy-start"})

# -- compute --------------------------------------------------------------------------------------

# Matmuls and convolutions as opcodes (the TPU compiler writes matmuls as `convolution` with
# matmul dim_labels; `ragged-dot` is the grouped matmul of MoE layers).
MATMUL = frozenset({"dot", "convolution", "ragged-dot", "scaled-dot"})
# Custom-call targets that are matmuls or convolutions (cuBLAS, cuDNN, oneDNN) or Pallas/Mosaic
# kernels (`tpu_custom_call`), which are written for the MXU/tensor cores.
MATMUL_CALL_PREFIXES = ("__cublas$", "__cudnn$conv", "__onednn$matmul", "__onednn$convolution", "tpu_custom_call",
                        "__gpu$xla.gpu.triton")

# HloCostAnalysis::HandleElementwiseOp counts these as transcendentals, not FLOPs.
TRANSCENDENTAL = frozenset({
    "erf", "exponential", "log", "logistic", "power", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine",
    "exponential-minus-one", "log-plus-one", "atan2", "tan",
})
# One FLOP (or transcendental) per output element (the ops XLA routes to HandleElementwiseOp).
ELEMENTWISE = TRANSCENDENTAL | frozenset({
    "abs", "add", "and", "bitcast-convert", "ceil", "clamp", "compare", "complex", "convert",
    "count-leading-zeros", "divide", "floor", "imag", "is-finite", "maximum", "minimum", "multiply",
    "negate", "not", "or", "popcnt", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "select", "shift-left", "shift-right-arithmetic", "shift-right-logical",
    "sign", "stochastic-convert", "subtract", "xor",
})
REDUCE = frozenset({"reduce", "reduce-window", "select-and-scatter", "sort", "reduce-precision"})
# `dot` and `convolution` alone (not ragged-dot or scaled-dot): the two a matmul probe re-creates
# from the step's optimized HLO with their attributes (`compile/matmul_probe.py`).
DOT_CONVOLUTION = frozenset({"dot", "convolution"})

# -- data movement, bookkeeping, control ----------------------------------------------------------

# The TPU compiler's async slice (not an XLA opcode: libtpu prints it in its optimized HLO).
TPU_ASYNC_SLICE = frozenset({"slice-start", "slice-done"})
DATA_MOVEMENT = TPU_ASYNC_SLICE | frozenset({
    "copy", "copy-start", "copy-done", "transpose", "gather", "scatter", "dynamic-slice",
    "dynamic-update-slice", "slice", "concatenate", "pad", "reshape", "broadcast", "bitcast", "reverse",
    "tuple", "get-tuple-element", "bitcast-convert", "iota", "constant", "parameter",
})
# Instructions that compute nothing and move no data: inputs, literals, tuples and views of an
# existing buffer, and ordering tokens.
BOOKKEEPING = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency",
    "domain", "opt-barrier",
})
# The device's own ids: a scalar the runtime supplies.
IDS = frozenset({"partition-id", "replica-id"})
# Views: the same tensor, the same elements, no read (followed through without a cost).
VIEWS = frozenset({"bitcast", "opt-barrier", "domain"})
# The same elements in the same row-major order (a bitcast too, where its layouts keep that order:
# `evaluate.py` checks it).
SAME_ELEMENTS = frozenset({"copy", "reshape"})
# Instructions whose result is no new array of its own (views, tuples, literals, ids, the halves of
# async pairs whose buffer is another's): `suggest/layout.py` looks for padding in the others.
NO_NEW_BUFFER = frozenset({"bitcast", "get-tuple-element", "tuple", "constant", "copy-done", "copy-start",
                           "async-done", "async-start", "after-all", "partition-id", "replica-id"})
# Ops that move or re-type a value without computing on it: followed through when looking for the
# op that produced a value (a softmax's exp behind a convert and a bitcast is still its exp).
TRANSPARENT = frozenset({"bitcast", "copy", "reshape", "transpose", "convert", "copy-done", "copy-start",
                         "bitcast-convert", "opt-barrier"})
# The subset of TRANSPARENT that keeps an integer's value, on purpose: `loops.py` follows a scalar
# loop counter through them (bitcast-convert re-reads its bits as another type; copy-start returns a
# tuple, not the value; a transpose or an opt-barrier does not carry a counter).
INTEGER_TRANSPARENT = frozenset({"copy", "bitcast", "convert", "copy-done", "reshape"})

# Control flow that runs its called computations in line (`parse.hlo_model.RUNS_CALLEES` is these and
# async-start: parse/ may not import analyze/, so it spells its own).
CONTROL_FLOW = frozenset({"while", "conditional", "call"})
CONTROL = CONTROL_FLOW | ASYNC
# Custom calls that reserve memory and move nothing: the TPU compiler's `AllocateBuffer` (an
# uninitialized buffer a loop then fills in place; a v5e trace has no event for it).
NO_WORK_CALLS = frozenset({"AllocateBuffer"})
HOST = frozenset({"infeed", "outfeed"})


def is_gradient(instr) -> bool:
    """JAX names the ops of a gradient `transpose(jvp(...))` in their `op_name` metadata."""
    return instr is not None and "transpose(" in ((instr.metadata or {}).get("op_name") or "")
