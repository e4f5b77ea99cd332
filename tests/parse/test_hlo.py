"""The HLO parser, held to XLA's own parser on every HLO file in the fixtures, and its errors."""

from __future__ import annotations

import re

import pytest
from jaxlib import _hlo

from tests.conftest import ARTIFACTS, glob_sets, set_id, skip_if_newer_than_this_xla
from tpudiag.errors import ParseError
from tpudiag.parse.hlo import find_optimized_modules, parse_hlo_text, read_hlo_file

HLO_FILES = glob_sets("*/hlo/*optimizations.txt", "*/modules/*/hlo/*optimizations.txt", "*/modules/*/optimized.hlo.txt")


# Opcodes whose text spelling (HloOpcodeString in XLA) is not the kebab-case of the enum name.
_SPELLING = {"log1p": "log-plus-one", "expm1": "exponential-minus-one", "exp": "exponential",
             "optimization-barrier": "opt-barrier", "population-count": "popcnt", "cos": "cosine",
             "sin": "sine", "clz": "count-leading-zeros", "top-k": "topk"}


def _opcode(enum) -> str:
    """HloOpcode.kGetTupleElement -> get-tuple-element (XLA's text spelling)."""
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", enum.name[1:]).lower()
    return _SPELLING.get(kebab, kebab)


def test_there_are_hlo_fixtures():
    assert len(HLO_FILES) >= 8


@pytest.mark.parametrize("path", HLO_FILES, ids=set_id)
def test_agrees_with_xla_parser(path):
    skip_if_newer_than_this_xla(path)
    text = path.read_text()
    oracle = {}
    for comp in _hlo.hlo_module_from_text(text).computations():
        for i in comp.instructions():
            oracle[i.name] = (_opcode(i.opcode), [o.name for o in i.operands()])
    mine = {i.name: (i.opcode, i.operands) for i in read_hlo_file(path).instructions()}
    assert mine == oracle


def test_source_lines_resolve_through_stack_frames():
    mods = find_optimized_modules(ARTIFACTS / "mlp" / "hlo")
    module = next(read_hlo_file(p) for p in mods.values() if "train_step" in p.name)
    sources = {module.source_frames(i)[0][0] for i in module.instructions() if module.source_frames(i)}
    assert any(s.endswith("fixtures/programs/mlp.py") for s in sources)


def test_inline_source_metadata_of_older_dumps():
    text = ('HloModule m\n\nENTRY %main (p: f32[2]) -> f32[2] {\n'
            '  %p = f32[2]{0} parameter(0)\n'
            '  ROOT %n = f32[2]{0} negate(%p), metadata={op_name="jit(f)/neg" source_file="/a/b.py" source_line=7}\n}\n')
    module = parse_hlo_text(text)
    assert module.source_frames(module.entry.instructions[1]) == [("/a/b.py", 7, "")]


def test_tpu_layouts_and_tuple_shapes():
    text = ('HloModule m\n\nENTRY %main (p: bf16[8,128]) -> (bf16[8,128], s32[]) {\n'
            '  %p = bf16[8,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)\n'
            '  %c = s32[] constant(3)\n'
            '  ROOT %t = (bf16[8,128]{1,0:T(8,128)(2,1)}, s32[]) tuple(%p, %c)\n}\n')
    module = parse_hlo_text(text)
    p, c, t = module.entry.instructions
    assert p.shape == "bf16[8,128]{1,0:T(8,128)(2,1)S(1)}" and p.operands == []
    assert t.opcode == "tuple" and t.operands == ["p", "c"] and t.shape.startswith("(")


def test_truncated_module_names_file_and_line(tmp_path):
    src = next(iter(HLO_FILES)).read_text().splitlines()
    bad = tmp_path / "cut.txt"
    bad.write_text("\n".join(src[: len(src) - 2]) + "\n")
    with pytest.raises(ParseError) as e:
        read_hlo_file(bad)
    assert str(bad) in str(e.value) and "not closed" in str(e.value)


@pytest.mark.parametrize("text,problem", [
    ("", "empty file"),
    ("not hlo at all\n", "HloModule"),
    ("HloModule m\n\nENTRY %main () -> f32[] {\n  this is not an instruction\n}\n", "expected an instruction"),
    ("HloModule m\n\nENTRY %main () -> f32[] {\n  %x = f32[] negate(%y\n}\n", "malformed"),
])
def test_garbage(tmp_path, text, problem):
    bad = tmp_path / "bad.txt"
    bad.write_text(text)
    with pytest.raises(ParseError, match=problem) as e:
        read_hlo_file(bad)
    assert "\n" not in str(e.value)


def test_binary_file(tmp_path):
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ParseError, match="not text"):
        read_hlo_file(bad)


def test_sparsecore_computations_are_read_and_marked():
    """v6e offloads megablox's group metadata to SparseCore: those computations close with
    `}, execution_thread="sparsecore"` (fixtures/programs/tpu_megablox.py)."""
    (path,) = (ARTIFACTS / "tpu_v6e_megablox" / "hlo").glob("*after_optimizations.txt")
    module = read_hlo_file(path)
    threads = [c.execution_thread for c in module.computations.values()]
    closing = re.findall(r'^\}, execution_thread="sparsecore"$', path.read_text(), re.M)
    assert threads.count("sparsecore") == len(closing) > 0
    assert module.entry is not None and module.entry.execution_thread is None


# jax 0.12's XLA prints a tuple element as an operand (`%t#1`); older XLA prints a get-tuple-element.
_GTE_OLD = """HloModule m

ENTRY %main (p: (f32[4], s32[], /*index=2*/bf16[2,8])) -> bf16[2,8] {
  %p = (f32[4]{0}, s32[], /*index=2*/bf16[2,8]{1,0}) parameter(0)
  %p_2 = bf16[2,8]{1,0} get-tuple-element(%p), index=2
  %n = bf16[2,8]{1,0} negate(%p_2)
  ROOT %a = bf16[2,8]{1,0} add(%n, %p_2)
}
"""
_GTE_NEW = """HloModule m

ENTRY %main (p: (f32[4], s32[], /*index=2*/bf16[2,8])) -> bf16[2,8] {
  %p = (f32[4]{0}, s32[], /*index=2*/bf16[2,8]{1,0}) parameter(0)
  %n = bf16[2,8]{1,0} negate(%p#2)
  ROOT %a = bf16[2,8]{1,0} add(%n, %p#2)
}
"""


def _model(module):
    return [(i.name, i.opcode, i.shape, i.operands, i.attrs) for i in module.instructions()]


def test_tuple_element_operands_give_the_model_of_a_get_tuple_element():
    old, new = parse_hlo_text(_GTE_OLD, "old.txt"), parse_hlo_text(_GTE_NEW, "new.txt")
    assert _model(new) == _model(old)
    gte = next(i for i in new.instructions() if i.opcode == "get-tuple-element")
    assert (gte.name, gte.operands, gte.attrs, gte.shape, gte.line) == ("p_2", ["p"], "index=2", "bf16[2,8]{1,0}", 5)
    # XLA's parser builds the same instruction, under the same name, from the new spelling.
    oracle = {i.name: (_opcode(i.opcode), [o.name for o in i.operands()])
              for c in _hlo.hlo_module_from_text(_GTE_OLD).computations() for i in c.instructions()}
    assert {i.name: (i.opcode, i.operands) for i in new.instructions()} == oracle


def test_tuple_element_operand_past_the_tuple_names_file_and_line():
    with pytest.raises(ParseError, match=r"^bad\.txt:5: instruction n: operand p#3 takes element 3 of p"):
        parse_hlo_text(_GTE_NEW.replace("negate(%p#2)", "negate(%p#3)"), "bad.txt")


def test_jax_0_12_dumps_have_tuple_element_operands_and_read_like_jax_0_10s():
    from tests.conftest import ARTIFACT_SETS

    new = next(ARTIFACT_SETS["jax-0.12"].glob("decoder/hlo/*jit_make_inputs.cpu_after_optimizations.txt"))
    assert re.search(r"\(%[\w.]+#\d+\)", new.read_text()), "the fixture shows the new spelling"
    module = read_hlo_file(new)
    assert all("#" not in o for i in module.instructions() for o in i.operands)
    defined = {i.name for i in module.instructions()}
    assert all(o in defined for i in module.instructions() for o in i.operands)
