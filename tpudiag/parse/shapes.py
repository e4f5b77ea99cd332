"""Reads XLA shape text (`f32[256,512]{1,0}`, `(bf16[8,128]{1,0:T(8,128)(2,1)S(1)}, s32[])`) into a
small frozen `Shape` model: element type, dimensions (with `<=` bounded-dynamic dims), layout
(minor-to-major order, tiles, element size, memory space) and tuple elements.

`Shape.bytes` is the *logical* size: product of the dimensions times the element size, summed
over tuple leaves. It ignores tiling padding (a TPU `bf16[3,5]{1,0:T(8,128)(2,1)}` occupies a full
16x128 tile in memory but counts 30 bytes here) and XLA's pointer tables for tuples. Bounded
dynamic dims count at their bound; unbounded ones (`?`) count as 0.

It does not read files or HLO instructions (that is `parse/hlo.py`). Bad text raises ValueError
with the column and what was expected; the HLO parser turns that into a ParseError.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

# Bits per element for every XLA primitive type (xla/xla_data.proto PrimitiveType; spelled as
# primitive_util::LowercasePrimitiveTypeName writes them in HLO text). Sub-byte types are counted
# packed (TPU layouts store s4 two to a byte, `E(4)`), so s4[8] is 4 bytes.
ELEMENT_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f4e2m1fn": 4,
    "f6e2m3fn": 6, "f6e3m2fn": 6,  # XLA in jax 0.12 (MX formats)
    "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e4m3fnuz": 8, "f8e5m2": 8,
    "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "bf16": 16, "f16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128,
    "token": 0, "opaque": 0,
}
TUPLE = "tuple"

_DTYPE = re.compile(r"[a-z][a-z0-9]*")
_INT = re.compile(r"-?\d+")
_COMMENT = re.compile(r"/\*.*?\*/")


def element_bytes(element_type: str) -> float:
    """Bytes per element (0.5 for s4/u4); KeyError for an unknown type."""
    return ELEMENT_BITS[element_type] / 8


@dataclass(frozen=True)
class Layout:
    """The `{...}` after an array shape. `memory_space` is `S(n)`: 0 is the default (HBM on TPU), 1
    the alternate memory that XLA's memory-space assignment uses (VMEM on TPU), 5 pinned host."""

    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...] = ()  # T(8,128)(2,1) -> ((8, 128), (2, 1)); `*` (combined dim) is -1
    element_size_bits: int = 0  # E(n); 0 means the type's own size
    memory_space: int = 0  # S(n)
    other: tuple[str, ...] = ()  # items kept verbatim: D(...), L(n), #(...), *(...), SC(...), P(...), M(n)

    def __str__(self) -> str:
        items = [x for x in self.other if x.startswith("D(")]
        if self.tiles:
            items.append("T" + "".join("(" + ",".join("*" if d == -1 else str(d) for d in t) + ")" for t in self.tiles))
        items += [x for x in self.other if not x.startswith(("D(", "SC(", "P(", "M("))]
        if self.element_size_bits:
            items.append(f"E({self.element_size_bits})")
        if self.memory_space:
            items.append(f"S({self.memory_space})")
        items += [x for x in self.other if x.startswith(("SC(", "P(", "M("))]
        m2m = ",".join(map(str, self.minor_to_major))
        return "{" + m2m + (":" + "".join(items) if items else "") + "}"


@dataclass(frozen=True)
class Shape:
    """An array (`element_type` a dtype), a tuple (`element_type == "tuple"`), or a token/opaque."""

    element_type: str
    dims: tuple[int, ...] = ()  # -1 for an unbounded dynamic dim (`?`)
    dynamic: tuple[bool, ...] = ()  # per dim: written `<=N` (N is the bound) or `?`
    layout: Layout | None = None
    tuple_shapes: tuple[Shape, ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.element_type == TUPLE

    @property
    def is_array(self) -> bool:
        return self.element_type not in (TUPLE, "token", "opaque")

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def memory_space(self) -> int:
        return self.layout.memory_space if self.layout else 0

    @property
    def elements(self) -> int:
        """Elements of an array (1 for a scalar; bounded dims at their bound, `?` as 0); 0 otherwise."""
        if not self.is_array:
            return 0
        return math.prod(max(d, 0) for d in self.dims)

    def leaves(self) -> tuple[Shape, ...]:
        """The non-tuple shapes inside, depth first (the shape itself if it is not a tuple)."""
        if not self.is_tuple:
            return (self,)
        return tuple(leaf for s in self.tuple_shapes for leaf in s.leaves())

    @property
    def bytes(self) -> int:
        """Logical bytes: elements x element size (rounded up to whole bytes), summed over tuple leaves.
        Tiling padding and tuple pointer tables are not counted."""
        if self.is_tuple:
            return sum(s.bytes for s in self.tuple_shapes)
        bits = (self.layout.element_size_bits if self.layout and self.layout.element_size_bits else
                ELEMENT_BITS[self.element_type])
        return (self.elements * bits + 7) // 8

    @property
    def tiled_bytes(self) -> int:
        """Bytes as laid out in memory: the most minor dims padded to the layout's first tile
        (`T(8,128)`: the second-minor dim to a multiple of 8, the minor one to 128), summed over tuple
        leaves; `bytes` where the layout has no tile. A bf16[4,2048,16,64]{3,1,2,0:T(8,128)(2,1)}
        takes twice its logical bytes: its minor dim of 64 fills half of each 128-wide tile row."""
        if self.is_tuple:
            return sum(s.tiled_bytes for s in self.tuple_shapes)
        tiles = self.layout.tiles if self.layout else ()
        if not self.is_array or not tiles or any(t <= 0 for t in tiles[0]):
            return self.bytes
        dims = [max(d, 0) for d in self.dims]
        extra = 1
        for t, d in zip(reversed(tiles[0]), self.layout.minor_to_major + (None,) * len(tiles[0])):
            if d is None:  # a tile over more dims than the shape has: the missing ones are 1, padded to t
                extra *= t
            elif d < len(dims):
                dims[d] = -(-dims[d] // t) * t
        bits = self.layout.element_size_bits or ELEMENT_BITS[self.element_type]
        return (math.prod(dims) * extra * bits + 7) // 8

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(map(str, self.tuple_shapes)) + ")"
        dims = ",".join("?" if d < 0 else (f"<={d}" if dyn else str(d)) for d, dyn in zip(self.dims, self.dynamic))
        return f"{self.element_type}[{dims}]" + (str(self.layout) if self.layout is not None else "")


class _Reader:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def fail(self, expected: str):
        got = repr(self.text[self.i:self.i + 12]) if self.i < len(self.text) else "the end"
        shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        raise ValueError(f"bad shape {shown!r}: expected {expected} at column {self.i + 1}, got {got}")

    def skip_ws(self):
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.i)

    def take(self, s: str) -> bool:
        if self.peek(s):
            self.i += len(s)
            return True
        return False

    def expect(self, s: str):
        if not self.take(s):
            self.fail(f"{s!r}")

    def match(self, pattern: re.Pattern, expected: str) -> str:
        m = pattern.match(self.text, self.i)
        if not m:
            self.fail(expected)
        self.i = m.end()
        return m.group(0)

    def balanced(self) -> str:
        """From an opening '(' to its matching ')', inclusive."""
        start, depth = self.i, 0
        while self.i < len(self.text):
            ch = self.text[self.i]
            self.i += 1
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                return self.text[start:self.i]
        self.i = start
        self.fail("a closing ')'")


def _read_shape(r: _Reader) -> Shape:
    r.skip_ws()
    if r.take("("):
        elems: list[Shape] = []
        r.skip_ws()
        if not r.take(")"):
            while True:
                elems.append(_read_shape(r))
                r.skip_ws()
                if r.take(")"):
                    break
                if not r.take(","):
                    r.fail("',' or ')' in a tuple")
        return Shape(TUPLE, tuple_shapes=tuple(elems))
    dtype = r.match(_DTYPE, "an element type such as f32")
    if dtype not in ELEMENT_BITS:
        r.i -= len(dtype)
        r.fail("a known element type (pred, s8, bf16, f32, f8e4m3fn, c64, token, ...)")
    dims, dynamic = [], []
    if r.take("["):
        if not r.take("]"):
            while True:
                if r.take("?"):
                    dims.append(-1)
                    dynamic.append(True)
                else:
                    dyn = r.take("<=")
                    start = r.i
                    d = int(r.match(_INT, "a dimension size"))
                    if d < 0:
                        r.i = start
                        r.fail("a non-negative dimension size")
                    dims.append(d)
                    dynamic.append(dyn)
                if r.take("]"):
                    break
                if not r.take(","):
                    r.fail("',' or ']' in the dimensions")
    elif dtype not in ("token", "opaque"):
        r.fail("'[' after the element type")
    layout = _read_layout(r) if r.peek("{") else None
    return Shape(dtype, tuple(dims), tuple(dynamic), layout)


def _ints(r: _Reader, close: str, star: bool = False) -> tuple[int, ...]:
    out: list[int] = []
    if r.take(close):
        return ()
    while True:
        out.append(-1 if star and r.take("*") else int(r.match(_INT, "an integer")))
        if r.take(close):
            return tuple(out)
        if not r.take(","):
            r.fail(f"',' or {close!r}")


def _read_layout(r: _Reader) -> Layout:
    r.expect("{")
    m2m: list[int] = []
    while r.i < len(r.text) and r.text[r.i] not in ":}":
        m2m.append(int(r.match(_INT, "a dimension number")))
        if not r.peek(":") and not r.peek("}") and not r.take(","):
            r.fail("',', ':' or '}' in the layout")
    tiles: list[tuple[int, ...]] = []
    esize = mspace = 0
    other: list[str] = []
    if r.take(":"):
        while not r.take("}"):
            if r.take("T"):
                if not r.peek("("):
                    r.fail("'(' after T")
                while r.take("("):
                    tiles.append(_ints(r, ")", star=True))
            elif r.take("E("):
                esize = int(r.match(_INT, "an element size in bits"))
                r.expect(")")
            elif r.take("S("):
                mspace = int(r.match(_INT, "a memory space number"))
                r.expect(")")
            else:
                m = re.compile(r"SC|[DL#*PM]").match(r.text, r.i)
                if not m or not r.text.startswith("(", m.end()):
                    r.fail("a layout item (T, E, S, D, L, #, *, SC, P or M) or '}'")
                r.i = m.end()
                groups = r.balanced()
                while m.group(0) == "SC" and r.peek("("):  # SC(0:1,2)(1:3): one group per split config
                    groups += r.balanced()
                other.append(m.group(0) + groups)
    else:
        r.expect("}")
    return Layout(tuple(m2m), tuple(tiles), esize, mspace, tuple(other))


@functools.lru_cache(maxsize=8192)
def parse_shape(text: str) -> Shape:
    """Parse one shape; ValueError (with the column) on anything else. Cached: HLO repeats shapes."""
    if not isinstance(text, str):
        raise ValueError(f"bad shape {text!r}: expected text")
    r = _Reader(_COMMENT.sub("", text).strip())
    if not r.text:
        raise ValueError("bad shape '': empty")
    shape = _read_shape(r)
    r.skip_ws()
    if r.i != len(r.text):
        r.fail("end of the shape")
    return shape
