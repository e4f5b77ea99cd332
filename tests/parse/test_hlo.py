"""The HLO parser, held to XLA's own parser on every HLO file in the fixtures, and its errors."""

from __future__ import annotations

import json
import math
import re

import pytest
from jaxlib import _hlo

from tests.conftest import ARTIFACT_SETS, ARTIFACTS, ROOT, glob_sets, set_id, skip_if_newer_than_this_xla
from tpudiag.errors import ParseError
from tpudiag.parse.hlo import RUNS_CALLEES, WindowDim, find_optimized_modules, parse_hlo_text, read_hlo_file

HLO_FILES = glob_sets("*/hlo/*optimizations.txt", "*/modules/*/hlo/*optimizations.txt", "*/modules/*/optimized.hlo.txt")


# Opcodes whose text spelling (HloOpcodeString in XLA) is not the kebab-case of the enum name.
_SPELLING = {"log1p": "log-plus-one", "expm1": "exponential-minus-one", "exp": "exponential",
             "optimization-barrier": "opt-barrier", "population-count": "popcnt", "cos": "cosine",
             "sin": "sine", "clz": "count-leading-zeros", "top-k": "topk"}


def _opcode(enum) -> str:
    """HloOpcode.kGetTupleElement -> get-tuple-element (XLA's text spelling)."""
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", enum.name[1:]).lower()
    return _SPELLING.get(kebab, kebab)


def _skip_where_xla_renames(path) -> None:
    """The TPU compiler prints an asynchronous slice as `slice-start`/`slice-done` sugar, which XLA's
    parser expands into an async pair around a new `slice` whose generated name collides with the
    module's own (it renames one of them): instructions can no longer be compared by name. The
    corpus modules have them."""
    if " slice-start(" in path.read_text():
        pytest.skip("XLA's parser renames instructions around slice-start sugar: names cannot be compared")


def test_there_are_hlo_fixtures():
    assert len(HLO_FILES) >= 8


@pytest.mark.parametrize("path", HLO_FILES, ids=set_id)
def test_agrees_with_xla_parser(path):
    skip_if_newer_than_this_xla(path)
    _skip_where_xla_renames(path)
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


@pytest.mark.parametrize("version", sorted(ARTIFACT_SETS))
def test_a_stack_of_frames_reads_each_line_inside_the_function_it_names(version):
    """decoder.py's attention exp: attention <- _block <- loss_fn <- train_step <- main <- <module>,
    every line inside the function the dump names for it (checked against decoder.py's own AST)."""
    import ast

    mods = find_optimized_modules(ARTIFACT_SETS[version] / "decoder" / "hlo")
    module = next(read_hlo_file(p) for p in mods.values() if "train_step" in p.name)
    exp = next(i for i in module.instructions() if i.opcode == "exponential")
    frames = [f for f in module.source_frames(exp) if f[0].endswith("fixtures/programs/decoder.py")]
    assert [f[2] for f in frames] == ["attention", "_block", "loss_fn", "train_step", "main", "<module>"]
    tree = ast.parse((ROOT / "fixtures" / "programs" / "decoder.py").read_text())
    spans = {n.name: (n.lineno, n.end_lineno) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for _, line, func in frames[:-1]:
        assert spans[func][0] <= line <= spans[func][1], (func, line)
    site, library = module.call_site(exp)
    assert site == f"{frames[0][0]}:{frames[0][1]}" and library is None


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


# -- typed attribute fields and the module's graph, held to XLA's parser -------------------------
#
# `jaxlib._hlo` exposes an instruction's name, opcode, operands and users but not its attributes;
# its module serializes to XLA's own HloModuleProto, which holds every field XLA's parser read
# from the text. The few lines below read the protobuf wire format, so the field numbers of
# xla/service/hlo.proto (HloInstructionProto) and xla/xla_data.proto are the whole oracle.

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes) -> dict[int, list]:
    """field number -> values of one protobuf message (varints as ints, length-delimited as bytes)."""
    i, out = 0, {}
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = bytes(buf[i:i + n]), i + n
        else:  # fixed64 / fixed32: no field read here uses them
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        out.setdefault(num, []).append(value)
    return out


def _packed(values: list) -> tuple[int, ...]:
    """A repeated int64: packed (bytes of varints) or one varint per entry."""
    out = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
            continue
        i = 0
        while i < len(v):
            n, i = _varint(v, i)
            out.append(n)
    return tuple(out)


def _one(msg: dict, num: int, default=0):
    return msg.get(num, [default])[-1]


# HloModuleProto.computations = 3; HloComputationProto: name = 1, instructions = 2, id = 5.
# HloInstructionProto: name 1, opcode 2, metadata 7, fusion_kind 11, tuple_index 13, dimensions 14,
# window 15, slice_dimensions 17, custom_call_target 28, called_computation_ids 38,
# backend_config 43, replica_groups 49, collective_device_list 87 (replica_groups = 1), and in
# jax 0.12's XLA the mesh form at 93 (mesh = 1 with axes {name 1, size 2}; axes = 2 {index 1}).
def _xla_instructions(text: str) -> dict[str, dict]:
    proto = _fields(_hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())
    comps = [_fields(c) for c in proto[3]]
    names = {_one(c, 5): _one(c, 1, b"").decode() for c in comps}
    out = {}
    for c in comps:
        for raw in c.get(2, []):
            i = _fields(raw)
            i["called"] = [names[k] for k in _packed(i.get(38, []))]
            out[_one(i, 1, b"").decode()] = i
    return out


def _groups(msg: list) -> tuple[tuple[int, ...], ...]:
    return tuple(_packed(_fields(g).get(1, [])) for g in msg)


_APPLIES = {"reduce", "reduce-window", "map", "sort", "scatter", "all-reduce", "reduce-scatter",
            "all-reduce-start", "select-and-scatter", "fusion", "while", "call", "conditional"}


@pytest.mark.parametrize("path", HLO_FILES, ids=set_id)
def test_typed_fields_agree_with_xla_parser(path):
    skip_if_newer_than_this_xla(path)
    _skip_where_xla_renames(path)
    text = path.read_text()
    xla = _xla_instructions(text)
    module = read_hlo_file(path)
    checked = dict.fromkeys(("called", "fusion_kind", "index", "dimensions", "slice", "window", "target",
                             "backend_config", "replica_groups", "op_name"), 0)
    for instr in module.instructions():
        x = xla.get(instr.name)
        if x is None:
            continue
        op = instr.opcode
        if op in _APPLIES:
            mine = instr.called + [c for c in (instr.select, instr.scatter) if c]
            assert sorted(mine) == sorted(x["called"]), instr.name
            if op == "conditional":
                assert list(instr.branch_computations) == x["called"], instr.name
            if op == "while":
                assert {instr.body, instr.condition} == set(x["called"]), instr.name
            checked["called"] += 1
        if op == "fusion":
            assert instr.fusion_kind == _one(x, 11, b"").decode(), instr.name
            checked["fusion_kind"] += 1
        if op == "get-tuple-element":
            assert instr.index == _one(x, 13), instr.name
            checked["index"] += 1
        if instr.dimensions is not None:
            assert instr.dimensions == _packed(x.get(14, [])), instr.name
            checked["dimensions"] += 1
        elif op in ("transpose", "broadcast", "reduce"):
            raise AssertionError(f"{instr.name}: a {op} without dimensions")
        if op == "slice":
            want = tuple((_one(d, 1), _one(d, 2), _one(d, 3)) for d in map(_fields, x.get(17, [])))
            assert instr.slice == want, instr.name
            checked["slice"] += 1
        if 15 in x:
            dims = [_fields(d) for d in _fields(_one(x, 15, b"")).get(1, [])]
            want = tuple((_one(d, 1), _one(d, 2), _one(d, 3), _one(d, 4), _one(d, 6), _one(d, 5)) for d in dims)
            got = tuple((w.size, w.stride, w.pad_lo, w.pad_hi, w.lhs_dilate, w.rhs_dilate) for w in instr.window)
            assert got == want, instr.name
            checked["window"] += 1
        if op == "custom-call":
            assert instr.custom_call_target == _one(x, 28, b"").decode(), instr.name
            checked["target"] += 1
        if "backend_config" in instr.attributes:  # (XLA's TPU pipeline fills in some the text leaves out)
            try:
                want = json.loads(_one(x, 43, b""))
            except ValueError:
                want = None
            assert instr.backend_config == (want if isinstance(want, dict) else None), instr.name
            checked["backend_config"] += 1
        if instr.replica_groups is not None:
            rg = instr.replica_groups
            listed = x.get(49) or _fields(_one(x, 87, b"")).get(1)
            if listed:
                assert rg.groups == _groups(listed), instr.name
                assert rg.group_size == len(rg.groups[0]), instr.name
            elif 93 in x:  # the mesh form: the group is the product of the listed axes
                mesh_axes = _fields(_one(x, 93, b""))
                axes = [_fields(a) for a in _fields(_one(mesh_axes, 1, b"")).get(1, [])]
                refs = [_one(_fields(r), 1) for r in mesh_axes.get(2, [])]
                assert rg.mesh == tuple((_one(a, 1, b"").decode(), _one(a, 2)) for a in axes), instr.name
                assert rg.axes == tuple(rg.mesh[k][0] for k in refs), instr.name
                assert rg.group_size == math.prod(rg.mesh[k][1] for k in refs), instr.name
            checked["replica_groups"] += 1
        if 7 in x:
            want = _one(_fields(_one(x, 7, b"")), 2, b"").decode()
            assert instr.metadata.get("op_name", "") == want, instr.name
            checked["op_name"] += 1
    # What the file holds was compared, not skipped over.
    assert checked["called"] == sum(i.opcode in _APPLIES and i.name in xla for i in module.instructions())
    assert checked["op_name"] == sum(7 in x for x in xla.values() if module.instruction(_one(x, 1, b"").decode()))


@pytest.mark.parametrize("path", HLO_FILES, ids=set_id)
def test_users_and_operands_agree_with_xla_parser(path):
    skip_if_newer_than_this_xla(path)
    _skip_where_xla_renames(path)
    text = path.read_text()
    oracle = {i.name: ([o.name for o in i.operands()], [u.name for u in i.users()])
              for c in _hlo.hlo_module_from_text(text).computations() for i in c.instructions()}
    module = read_hlo_file(path)
    for instr in module.instructions():
        operands, users = oracle[instr.name]
        assert [module.operand(instr, k).name for k in range(len(instr.operands))] == operands
        assert sorted(u.name for u in module.users_of(instr)) == sorted(users), instr.name
        assert module.instruction(instr.name, instr.computation) is instr
        for use in module.uses_of(instr):
            assert use.user.operands[use.position] == instr.name


@pytest.mark.parametrize("path", HLO_FILES, ids=set_id)
def test_executed_computations_are_xlas_non_fusion_computations_less_the_applied_ones(path):
    """XLA's MakeNonfusionComputations lists every computation that is not a fusion body; the
    executed ones are those less what ops apply (reducers, comparators) and SparseCore's."""
    skip_if_newer_than_this_xla(path)
    module = read_hlo_file(path)
    if module.entry is None:
        return
    xla = {c.name for c in _hlo.hlo_module_from_text(path.read_text()).make_nonfusion_computations()}
    executed = set(module.executed_computations)
    assert module.executed_computations[0] == module.entry.name
    assert executed <= xla
    applied = {c for c, callers in module.callers.items()
               if all(key not in ("body", "condition", "branch_computations", "calls") for _, key in callers)}
    sparsecore = {c.name for c in module.computations.values() if c.execution_thread == "sparsecore"}
    for name in xla - executed:
        assert name in applied or name in sparsecore or name not in module.computations \
            or not any(name in i.called for i in module.instructions() if i.opcode in RUNS_CALLEES), name


def test_replica_group_spellings():
    """The three spellings XLA prints, and what each says about the groups."""
    from tpudiag.parse.hlo import parse_replica_groups

    listed = parse_replica_groups("{{0,1,2,3},{4,5,6,7}}")
    assert listed.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and listed.group_size == 4
    assert parse_replica_groups("{}").group_size is None  # every device in one group
    iota = parse_replica_groups("[2,4]<=[8]")
    assert iota.groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and iota.group_size == 4
    # [4,2]<=[2,4]T(1,0): iota(8) as 2x4, transposed to 4x2: groups down the columns.
    assert parse_replica_groups("[4,2]<=[2,4]T(1,0)").groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    mesh = parse_replica_groups("mesh['x'=4,'y'=2] {'x'}")
    assert (mesh.groups, mesh.group_size, mesh.mesh, mesh.axes) == (None, 4, (("x", 4), ("y", 2)), ("x",))
    assert parse_replica_groups("mesh['x'=4,'y'=2] {'x','y'}").group_size == 8
    assert parse_replica_groups("something new").group_size is None


def test_fields_of_a_hand_written_module():
    text = ('HloModule m\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n'
            '  ROOT %s = f32[] add(%a, %b)\n}\n\n'
            'ENTRY %main (p: f32[8,16]) -> f32[4,8] {\n  %p = f32[8,16]{1,0} parameter(0)\n'
            '  %z = f32[] constant(0)\n'
            '  %w = f32[8,8]{1,0} reduce-window(%p, %z), window={size=1x3 stride=1x2 pad=0_0x1_0 rhs_dilate=1x1}, '
            'to_apply=%add\n'
            '  %sl = f32[4,8]{1,0} slice(%w), slice={[0:8:2], [0:8]}\n'
            '  ROOT %t = f32[4,8]{1,0} transpose(%sl), dimensions={1,0}, '
            'frontend_attributes={kernel_metadata={}}, metadata={op_name="f/t" source_file="/a\\"b.py" source_line=3}, '
            'backend_config={"known_trip_count":{"n":"32"}}\n}\n')
    module = parse_hlo_text(text)
    w, sl, t = (module.instruction(n, "main") for n in ("w", "sl", "t"))
    assert w.window == (WindowDim(1, 1, 0, 0, 1, 1), WindowDim(3, 2, 1, 0, 1, 1)) and w.to_apply == "add"
    assert w.called == ["add"] and module.callers["add"] == [(w, "to_apply")]
    assert sl.slice == ((0, 8, 2), (0, 8, 1))
    assert t.dimensions == (1, 0)
    # `kernel_metadata={}` inside frontend_attributes is not the instruction's metadata.
    assert t.metadata == {"op_name": "f/t", "source_file": '/a"b.py', "source_line": "3"}
    assert t.backend_config == {"known_trip_count": {"n": "32"}}
    assert t.known_trip_count is None  # a while's field only
    assert t.attributes["frontend_attributes"] == "{kernel_metadata={}}"
    assert module.users_of(module.instruction("p")) == [w]
    assert module.computations["main"].root is t
    assert module.executed_computations == ("main",) and module.fused_computations() == set()


def test_known_trip_count_and_bad_backend_config():
    loop = ('HloModule m\n\n%c (s: s32[]) -> pred[] {\n  %s = s32[] parameter(0)\n  %k = s32[] constant(4)\n'
            '  ROOT %lt = pred[] compare(%s, %k), direction=LT\n}\n\n'
            '%b (s.1: s32[]) -> s32[] {\n  %s.1 = s32[] parameter(0)\n  ROOT %n = s32[] negate(%s.1)\n}\n\n'
            'ENTRY %main (p: s32[]) -> s32[] {\n  %p = s32[] parameter(0)\n'
            '  ROOT %w = s32[] while(%p), condition=%c, body=%b, backend_config=CONFIG\n}\n')
    w = parse_hlo_text(loop.replace("CONFIG", '{"known_trip_count":{"n":"32"}}')).instruction("w")
    assert (w.known_trip_count, w.body, w.condition, w.called) == (32, "b", "c", ["b", "c"])
    assert parse_hlo_text(loop.replace("CONFIG", '"{\\"known_trip_count\\":{\\"n\\":\\"7\\"}}"')).instruction("w") \
        .known_trip_count == 7  # the escaped-string spelling of older dumps
    bad = parse_hlo_text(loop.replace("CONFIG", '{"known_trip_count":{"n":"32",}}'))  # a trailing comma
    assert bad.instruction("w").backend_config is None and bad.instruction("w").known_trip_count is None
    module = parse_hlo_text(loop.replace(", backend_config=CONFIG", ""))
    assert module.executed_computations == ("main", "b", "c")  # body before condition, as `called` lists them
