"""Grouped matmuls on a dynamic grid: MXU work in whole row tiles.

A megablox-style grouped matmul (JAX's `megablox.gmm`, MaxText's `gmm` and `tgmm`, and kernels
built on them) splits the rows, sorted by group (an MoE's tokens by expert), into row tiles of
`tm` and visits one tile per (group, row tile) pair: a tile that holds the end of one group and
the start of the next is multiplied once for each, in full, with the other group's rows masked
when the result is stored. The number of visits is known only at run time (the grid's middle axis
is a scalar operand); the compiler's static profile cannot follow it, and the kernel's own
`pl.CostEstimate` counts the useful FLOPs (2 M K N) only.

What the HLO does say: the kernel's scalar-prefetched group metadata has fixed sizes. The group
offsets are [G + 1] and the group ids and row-tile ids of the visits are [tiles_m + G - 1], the
most visits any routing can need (each of the G - 1 group boundaries inside a tile adds one). So
G and tiles_m = ceil(M / tm) are read from the operand shapes, M from the rows operand.

The model: routing spreads the M rows over the G groups evenly at random (balanced routing). Then
a boundary falls inside a tile except with probability about 1/tm, and the groups with rows are
G (1 - (1 - 1/G)^M) on average, so the visits that multiply are tiles_m + that - 1 (tgmm's grid
also visits the empty groups, to zero their gradient, and skips the matmul there). The MXU work
is the useful FLOPs x those visits / tiles_m. No constant is fitted; a routing that is unbalanced
(or padded to whole tiles) visits fewer tiles, which is why the estimate's finding names the
assumption. Checked against megablox's own `make_group_metadata` on random routings
(tests/analyze/test_grouped_matmul_visits.py).

HBM bytes, where the kernel records its tiles (MaxText's and tokamax's kernels write
`"tiling": {"tile_m", "tile_k", "tile_n"}` into the custom call's kernel metadata for xprof; JAX's
`megablox.gmm` writes none): Pallas's pipeline skips a block's copy when its index is the same as
the step before. gmm's grid is (N tiles, visits, K tiles). With the whole K in one tile, the visits
of one group in a row keep its weight tile, so each N tile reads the weights of each group with
rows once, and x once per row tile; with K split, every visit reads its x and weight tiles again.
The kernels' own estimates count a group's whole weight at every visit (tokamax's `rhs_bytes *
group_ids.size`), which is the second case only. An operand XLA placed in VMEM (`S(1)`) moves
no HBM bytes. tgmm's grid (N tiles, K tiles, visits) reads x and the output gradient once per K or
N tile either way, which its own estimate says already.

Pure: takes the parsed module and one instruction; no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tpudiag.analyze.compile.memory_space import outside_hbm_bytes
from tpudiag.parse.hlo_model import HloModule, Instruction

_INTS = ("s32", "u32")
# `"tiling": {"tile_m": 512, "tile_k": 1024, "tile_n": 1024}` inside the kernel metadata's JSON string
_TILE = re.compile(r'tile_([mkn])\\?"\s*:\s*(\d+)')


@dataclass(frozen=True)
class TileVisits:
    groups: int  # G: the group offsets' size - 1
    rows: int  # M: the rows the kernel splits into tiles
    row_tiles: int  # tiles_m = ceil(M / tm)
    tile_rows: int  # tm
    expected: float  # the visits that multiply under balanced routing
    kind: str = "gmm"  # gmm (rows x weights -> rows) or tgmm (the weights' gradient)
    runs: float = 0.0  # gmm: the groups with rows under balanced routing (each a run of visits)
    tiles: tuple[int, int, int] | None = None  # (tm, tk, tn) from the kernel's metadata
    bytes_moved: int | None = None  # gmm with known tiles: the bytes its pipeline moves (module docstring)
    hbm_bytes: int | None = None  # of those, the ones in HBM (an operand XLA placed in VMEM is not)

    @property
    def most(self) -> int:
        """tiles_m + G - 1: the metadata's size, the visits of the worst routing."""
        return self.row_tiles + self.groups - 1

    @property
    def factor(self) -> float:
        """The MXU work of the visits over the useful work (1.0: every tile visited once)."""
        return self.expected / self.row_tiles


def _array(module: HloModule, instr: Instruction, k: int):
    op = module.operand(instr, k)
    if op is None:
        return None
    try:
        shape = op.parsed_shape
    except ValueError:
        return None
    return shape if shape.is_array else None


def tile_visits(module: HloModule, instr: Instruction) -> TileVisits | None:
    """The row-tile visits of a megablox-style grouped matmul custom call; None for any other op.

    The operands, in order: the grid's dynamic size (an integer scalar, or [1]), the group metadata
    (group offsets [G + 1], group ids [V] and row-tile ids [V], V = tiles_m + G - 1), the group offset
    [1], then the data: gmm's lhs [M, K] and rhs [G, K, N] or [G, N, K] (result [M, N]), or tgmm's
    lhs [M, K] and rhs [M, N] (result [G, K, N]), and an optional existing result that gmm adds to.
    tokamax's TPU `ragged_dot` kernel has the same operands. Shapes that do not agree are not this
    kernel, nor is a call over a slice of the groups (experts sharded: its weights hold fewer groups
    than the metadata, and which rows it visits depends on the shard), nor a quantized lhs (its
    scale is an operand before the weights)."""
    if instr.opcode != "custom-call" or instr.custom_call_target != "tpu_custom_call" or len(instr.operands) < 7:
        return None
    shapes = [_array(module, instr, k) for k in range(len(instr.operands))]
    if any(s is None for s in shapes[:7]):
        return None
    grid, offsets, ids, tiles, first = shapes[:5]
    if (grid.element_type not in _INTS or grid.elements != 1 or grid.rank > 1
            or any(s.element_type not in _INTS or s.rank != 1 for s in (offsets, ids, tiles, first))):
        return None
    groups, most = offsets.dims[0] - 1, ids.dims[0]
    if groups < 1 or tiles.dims[0] != most or first.dims[0] != 1:
        return None
    try:
        out = instr.parsed_shape
    except ValueError:
        return None
    lhs, rhs = shapes[5], shapes[6]
    if (out.rank == 2 and lhs.rank == 2 and rhs.rank == 3 and lhs.dims[0] == out.dims[0]
            and rhs.dims[0] == groups and lhs.dims[1] in rhs.dims[1:]):
        kind, rows = "gmm", lhs.dims[0]
    elif (out.rank == 3 and lhs.rank == 2 and rhs.rank == 2 and lhs.dims[0] == rhs.dims[0]
          and out.dims == (groups, lhs.dims[1], rhs.dims[1])):
        kind, rows = "tgmm", rhs.dims[0]
    else:
        return None
    row_tiles = most - groups + 1
    if row_tiles < 1 or rows < row_tiles:
        return None
    tile_rows = -(-rows // row_tiles)
    if -(-rows // tile_rows) != row_tiles:
        return None
    runs, visits = groups_with_rows(groups, rows), expected_visits(groups, rows, row_tiles)
    tiles = kernel_tiles(instr)
    moved = in_hbm = None
    if kind == "gmm" and tiles is not None:
        parts = gmm_bytes(lhs, rhs, out, visits=visits, runs=runs, tile_rows=tile_rows, tile_k=tiles[1],
                          tile_n=tiles[2], adds_to=len(shapes) > 7 and shapes[7] is not None)
        moved = sum(parts.values())
        in_hbm = int(sum(b for name, b in parts.items() if not _in_vmem(module, instr, name)))
    return TileVisits(groups=groups, rows=rows, row_tiles=row_tiles, tile_rows=tile_rows, expected=visits, kind=kind,
                      runs=runs, tiles=tiles, bytes_moved=moved, hbm_bytes=in_hbm)


def _in_vmem(module: HloModule, instr: Instruction, part: str) -> bool:
    """Whether gmm's `part` (x, w, out, or the existing result it adds to) is a buffer XLA placed
    outside HBM (`S(1)`, VMEM): its reads and writes cost no HBM bandwidth."""
    buffer = instr if part == "out" else module.operand(instr, {"x": 5, "w": 6, "adds_to": 7}[part])
    return outside_hbm_bytes(buffer) > 0


def kernel_tiles(instr: Instruction) -> tuple[int, int, int] | None:
    """(tile_m, tile_k, tile_n) as the kernel's metadata records them; None where it does not."""
    found = dict(_TILE.findall(instr.attrs))
    if set(found) != {"m", "k", "n"}:
        return None
    return int(found["m"]), int(found["k"]), int(found["n"])


def gmm_bytes(lhs, rhs, out, *, visits: float, runs: float, tile_rows: int, tile_k: int, tile_n: int,
              adds_to: bool = False) -> dict[str, int]:
    """Bytes gmm (x [M, K] @ the group's w [K, N] or [N, K] -> [M, N]) moves on its pipelined grid
    (N tiles, visits, K tiles), by operand: per N tile, x's row tiles once and each group's weight
    tile once per run of its visits where K is one tile; x's and the weight's tiles at every visit
    where K is split. The result once, and the existing result it adds to (`adds_to`) read once."""
    m, k = lhs.dims
    n = out.dims[1]
    x_item, w_item, out_item = (s.bytes / max(s.elements, 1) for s in (lhs, rhs, out))
    n_tiles = -(-n // max(tile_n, 1))
    if -(-k // max(tile_k, 1)) == 1:
        x, w = m * k * x_item * n_tiles, runs * k * n * w_item
    else:
        x, w = visits * tile_rows * k * x_item * n_tiles, visits * k * n * w_item
    parts = {"x": int(x), "w": int(w), "out": int(m * n * out_item)}
    if adds_to:
        parts["adds_to"] = parts["out"]
    return parts


def groups_with_rows(groups: int, rows: int) -> float:
    """The groups that get rows when `rows` rows are spread evenly at random over `groups` groups:
    G (1 - (1 - 1/G)^M), at least 1."""
    if groups == 1:
        return 1.0
    return max(groups * -math.expm1(rows * math.log1p(-1.0 / groups)), 1.0)


def expected_visits(groups: int, rows: int, row_tiles: int) -> float:
    """The row-tile visits that multiply when `rows` rows are spread evenly at random over `groups`
    groups: every tile once, plus one for each group after the first that has rows (a boundary
    inside a tile). tgmm's grid also visits each empty group, to zero its gradient, and multiplies
    nothing there; gmm's does not visit them."""
    return row_tiles + groups_with_rows(groups, rows) - 1.0
