"""The shape parser, held to XLA's own parser: every shape in the fixture HLO (CPU and TPU layouts),
every element type XLA knows, and garbage that both must reject."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from jaxlib import _hlo, xla_client

from tests.conftest import glob_sets
from tpudiag.parse.hlo import read_hlo_file
from tpudiag.parse.shapes import ELEMENT_BITS, Layout, Shape, element_bytes, parse_shape

HLO_FILES = glob_sets("*/hlo/*optimizations.txt")


def _xla_shapes(texts: list[str]) -> list:
    """XLA's parse of each shape text: one module whose parameters have those shapes."""
    body = "\n".join(f"  %p{k} = {s} parameter({k})" for k, s in enumerate(texts))
    module = _hlo.hlo_module_from_text(f"HloModule m\n\nENTRY %e {{\n{body}\n  ROOT %r = () tuple()\n}}\n")
    return list(xla_client.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape().parameter_shapes())


def _xla_rejects(text: str) -> bool:
    try:
        _xla_shapes([text])
    except Exception:  # jax's JaxRuntimeError: "Syntax error when trying to parse the text as a HloModule"
        return True
    return False


def _same(mine: Shape, xla) -> None:
    assert mine.is_tuple == xla.is_tuple()
    if xla.is_tuple():
        assert len(mine.tuple_shapes) == len(xla.tuple_shapes())
        for m, x in zip(mine.tuple_shapes, xla.tuple_shapes()):
            _same(m, x)
        return
    if xla.is_token():  # XLA's dimensions() aborts the process on a token
        assert mine.element_type == "token"
        return
    assert mine.dims == tuple(xla.dimensions())
    assert mine.dynamic == tuple(xla.is_dynamic_dimension(d) for d in range(xla.rank()))
    # Without a layout in the text (CPU dumps print scalars bare) XLA assumes the default one.
    layout = mine.layout or Layout(minor_to_major=tuple(reversed(range(mine.rank))))
    assert layout.minor_to_major == tuple(xla.layout().minor_to_major())
    assert layout.tiles == tuple(tuple(t) for t in xla.layout().tiling())
    assert layout.element_size_bits == xla.layout().element_size_in_bits()
    assert str(layout) == xla.layout().to_string()  # memory space S(n) included
    assert _bits(xla.numpy_dtype()) == ELEMENT_BITS[mine.element_type]


def _bits(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "cb":  # complex (numpy's finfo would give the component), bool
        return dtype.itemsize * 8
    for info in (ml_dtypes.finfo, ml_dtypes.iinfo):
        try:
            return info(dtype).bits
        except (TypeError, ValueError):
            pass
    return dtype.itemsize * 8


def test_every_fixture_shape_agrees_with_xla_parser():
    texts = sorted({i.shape for p in HLO_FILES for i in read_hlo_file(p).instructions()})
    assert len(texts) > 150 and any(":T(8,128)" in t for t in texts) and any("S(1)" in t for t in texts)
    assert any(t.startswith("(") for t in texts), "tuple shapes are among them"
    for text, xla in zip(texts, _xla_shapes(texts)):
        mine = parse_shape(text)
        _same(mine, xla)
        # The HLO parser strips `/*index=5*/` comments from shape text; XLA's printer adds them back.
        assert str(mine) == text == str(xla).replace("/*index=5*/", "").replace("/*index=10*/", "")


def test_tpu_layout_tiles_memory_space_and_logical_bytes():
    s = parse_shape("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}")
    assert (s.element_type, s.dims, s.rank, s.elements) == ("bf16", (8, 128), 2, 1024)
    assert s.layout == Layout(minor_to_major=(1, 0), tiles=((8, 128), (2, 1)), memory_space=1)
    assert s.memory_space == 1 and s.bytes == 2048
    # Logical bytes: a 3x5 bf16 array fills a whole (16,128) tile on a TPU, but counts 30 bytes.
    assert parse_shape("bf16[3,5]{1,0:T(8,128)(2,1)}").bytes == 30
    # Scalars, with and without a layout; the u32 context of an async copy lives in S(2).
    assert parse_shape("f32[]").bytes == 4 and parse_shape("f32[]").elements == 1
    ctx = parse_shape("u32[]{:S(2)}")
    assert (ctx.dims, ctx.memory_space, ctx.layout.minor_to_major, ctx.bytes) == ((), 2, (), 4)
    assert parse_shape("pred[16,3]{0,1:T(4,128)(4,1)}").bytes == 48
    assert parse_shape("f32[]{:T(128)}").layout.tiles == ((128,),)


def test_tuples_nested_empty_and_tokens():
    s = parse_shape("(f32[2]{0}, (s32[], pred[3]{0}), token[])")
    assert s.is_tuple and not s.is_array and len(s.tuple_shapes) == 3
    assert [leaf.element_type for leaf in s.leaves()] == ["f32", "s32", "pred", "token"]
    assert s.bytes == 8 + 4 + 3 + 0
    assert s.elements == 0  # a tuple has leaves, not elements
    assert parse_shape("()").bytes == 0 and parse_shape("()").tuple_shapes == ()
    assert parse_shape("token[]").bytes == 0 and not parse_shape("token[]").is_array
    # The async-copy tuple TPU compiles are full of: (destination in VMEM, source, context).
    cs = parse_shape("(bf16[4,256,128]{2,1,0:T(8,128)(2,1)S(1)}, bf16[4,256,128]{2,1,0:T(8,128)(2,1)}, u32[]{:S(2)})")
    assert [leaf.memory_space for leaf in cs.leaves()] == [1, 0, 2]
    assert cs.bytes == 2 * 4 * 256 * 128 * 2 + 4


def test_dynamic_dims_count_at_their_bound():
    s = parse_shape("f32[<=10,5]{1,0}")
    assert s.dims == (10, 5) and s.dynamic == (True, False) and s.bytes == 200
    assert str(s) == "f32[<=10,5]{1,0}"
    unbounded = parse_shape("f32[?,5]")
    assert unbounded.dynamic == (True, False) and unbounded.bytes == 0 and str(unbounded) == "f32[?,5]"
    _same(s, _xla_shapes(["f32[<=10,5]{1,0}"])[0])


def test_every_xla_element_type_and_its_size():
    xla_types = {m.lower() for m in _hlo.PrimitiveType.__members__} - {"primitive_type_invalid", "tuple",
                                                                       "opaque_type"}
    assert xla_types <= set(ELEMENT_BITS), "an element type XLA knows is missing from ELEMENT_BITS"
    # This XLA's own types: jax 0.12 adds f6e2m3fn and f6e3m2fn, which jax 0.10.2's parser refuses.
    arrays = sorted(t for t in ELEMENT_BITS if t in xla_types and t not in ("token", "opaque"))
    texts = [f"{t}[3,5]{{1,0}}" for t in arrays]
    for t, text, xla in zip(arrays, texts, _xla_shapes(texts)):  # XLA accepts every name we know
        mine = parse_shape(text)
        _same(mine, xla)
        bits = _bits(xla.numpy_dtype())
        assert element_bytes(t) == bits / 8
        assert mine.bytes == math.ceil(15 * bits / 8), t
    sizes = {t: element_bytes(t) for t in ("s4", "u4", "pred", "f8e4m3fn", "bf16", "c64", "c128", "f64")}
    assert sizes == {"s4": 0.5, "u4": 0.5, "pred": 1, "f8e4m3fn": 1, "bf16": 2, "c64": 8, "c128": 16, "f64": 8}
    # An explicit element size (TPU's packed int4) wins over the type's own.
    assert parse_shape("s4[8,16]{1,0:E(4)}").bytes == 64 and parse_shape("s8[8,16]{1,0:E(4)}").bytes == 64


def test_layout_items_round_trip():
    for text in ("f32[2,3]{0,1:T(2,128)L(1024)#(s64)*(u32)E(32)S(5)}", "f32[256]{0:T(256)SC(0:1,2)(0:3)}",
                 "f32[2]{0:P(s8[8]{0})M(8)}", "f32[2,3]", "f32[2,128]{1,0:T(2,*)}"):
        assert str(parse_shape(text)) == text
    assert parse_shape("f32[2,128]{1,0:T(2,*)}").layout.tiles == ((2, -1),)


@pytest.mark.parametrize("text,expected", [
    ("", "empty"),
    ("f32", "'[' after the element type"),
    ("f33[2]", "known element type"),
    ("f32[2", "',' or ']'"),
    ("f32[a]", "a dimension size"),
    ("f32[-1]", "non-negative"),
    ("f32[2]]", "end of the shape"),
    ("f32[2]{1,0", "in the layout"),
    ("f32[2]{0:Q(1)}", "a layout item"),
    ("f32[2]{0:T(8,x)}", "an integer"),
    ("(f32[2]{0}, s32[]", "',' or ')' in a tuple"),
    ("(f32[2]{0} s32[])", "',' or ')' in a tuple"),
    ("{1,0}", "element type"),
])
def test_garbage_raises_value_error_naming_what_was_expected(text, expected):
    with pytest.raises(ValueError, match="expected|empty") as err:
        parse_shape(text)
    assert expected in str(err.value)
    if text:
        assert _xla_rejects(text), f"XLA accepts {text!r}: the test case is wrong"
