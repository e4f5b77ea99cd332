"""The HLO vocabulary held to XLA's own: every opcode it names is one XLA's parser reads (jaxlib's
`_hlo`), each async collective form parses as the async op it is and is classed, costed and sized
as a collective; `message_bytes` agrees with a lookup in the collective's own computation on every
fixture compile, and `HloModule.walk` visits what the called computations hold."""

from __future__ import annotations

import pytest
from jaxlib import _hlo

from tests.conftest import glob_sets, set_id
from tests.parse.test_hlo import _opcode
from tpudiag.analyze.compile.report import ici_bytes
from tpudiag.analyze.hlo import vocabulary as V
from tpudiag.analyze.hlo.categories import classify
from tpudiag.analyze.hlo.collectives import bus_factor, collective_instruction, describe, message_bytes
from tpudiag.analyze.hlo.cost import ZERO_COST, module_costs
from tpudiag.parse.hlo import parse_hlo_text, read_hlo_file

# XLA's opcodes as its printer spells them.
XLA_OPCODES = frozenset(_opcode(op) for op in _hlo.HloOpcode.__members__.values())

_SETS = {name: getattr(V, name) for name in (
    "COLLECTIVE", "COLLECTIVE_START_TUPLE", "SEND_RECV", "ASYNC", "ASYNC_DONE", "MATMUL", "TRANSCENDENTAL",
    "ELEMENTWISE", "REDUCE", "DATA_MOVEMENT", "BOOKKEEPING", "IDS", "VIEWS", "TRANSPARENT", "CONTROL", "HOST")}
_SETS["cost.ZERO_COST"] = ZERO_COST

# The async forms of collectives without opcodes of their own: XLA's printer writes an async-start /
# -update / -done wrapping the collective as `<collective>-start` / `-update` / `-done`.
_SUGAR = sorted(V.COLLECTIVE - XLA_OPCODES)

_ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""
_ATTRS = {"reduce-scatter": "replica_groups={{0,1}}, dimensions={0}, to_apply=%add",
          "all-to-all": "replica_groups={{0,1}}, dimensions={0}", "ragged-all-to-all": "replica_groups={{0,1}}",
          "collective-broadcast": "replica_groups={{0,1}}"}
# (result shape, operand shapes) of each wrapped collective: a reduce-scatter halves its input.
_SHAPES = {"reduce-scatter": ("f32[4]{0}", "f32[8]{0}")}


def _async_module(kind: str) -> str:
    out, inp = _SHAPES.get(kind, ("f32[8]{0}", "f32[8]{0}"))
    tup = f"(({inp}), {out})"
    return (f"HloModule m\n\n{_ADD}\nENTRY %main (p: {inp.split('{')[0]}) -> {out.split('{')[0]} {{\n"
            f"  %p = {inp} parameter(0)\n"
            f"  %start = {tup} {kind}-start(%p), {_ATTRS[kind]}\n"
            f"  %update = {tup} {kind}-update(%start)\n"
            f"  ROOT %done = {out} {kind}-done(%update)\n}}\n")


def test_the_oracle_knows_the_opcodes():
    assert {"all-gather-start", "collective-permute-done", "async-start", "opt-barrier", "sine"} <= XLA_OPCODES
    assert len(XLA_OPCODES) > 100


@pytest.mark.parametrize("name", sorted(_SETS))
def test_every_opcode_is_one_xla_spells(name):
    unknown = _SETS[name] - XLA_OPCODES - frozenset(_SUGAR) - V.TPU_ASYNC_SLICE
    assert not unknown, f"{name}: not XLA opcodes: {sorted(unknown)}"


def test_every_collective_kind_and_its_own_async_opcodes_are_xla_opcodes():
    assert set(V.COLLECTIVE_KINDS) <= XLA_OPCODES
    own = {"all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
           "collective-permute-start", "collective-permute-done"}
    assert own <= XLA_OPCODES and own <= V.COLLECTIVE
    assert {"reduce-scatter-start", "all-to-all-start", "reduce-scatter-done", "all-to-all-done"} <= V.COLLECTIVE


def test_the_sugar_forms_are_only_the_wrapped_collectives():
    kinds = {V.collective_kind(op) for op in _SUGAR}
    assert kinds == {"reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-broadcast"}
    assert len(_SUGAR) == 3 * len(kinds)  # -start, -update, -done each


@pytest.mark.parametrize("kind", sorted({V.collective_kind(op) for op in _SUGAR}))
def test_an_async_collective_is_one_for_xla_and_for_us(kind):
    text = _async_module(kind)
    xla = {i.name: str(i.opcode).split(".")[-1] for c in _hlo.hlo_module_from_text(text).computations()
           for i in c.instructions()}
    assert (xla["start"], xla["update"], xla["done"]) == ("kAsyncStart", "kAsyncUpdate", "kAsyncDone")
    module = parse_hlo_text(text)
    start, update, done = (module.instruction(n) for n in ("start", "update", "done"))
    for instr in (start, update, done):
        assert V.collective_kind(instr.opcode) == kind
        assert classify(module, instr).bound == "communication"
    assert collective_instruction(module, start) is start
    costs = module_costs(module)
    assert costs["update"].bytes_accessed == costs["done"].bytes_accessed == 0
    assert costs["start"].bytes_accessed == 32 + (16 if kind == "reduce-scatter" else 32)  # operands + results
    op = describe(module, "done")
    assert op.kind == kind and op.op == "start"  # a -done resolves to its -start, through the -update
    # nccl-tests' size: a reduce-scatter's whole input, any other collective's whole result
    assert message_bytes(module, start) == 32
    assert ici_bytes(module, start, 2) == bus_factor(kind, 2) * 32
    assert ici_bytes(module, done, 2) == 0.0  # the -done moves nothing of its own


def test_all_reduce_start_is_its_result_not_a_tuple_of_operands():
    text = (f"HloModule m\n\n{_ADD}\nENTRY %main (p: f32[8], q: f32[2]) -> (f32[8], f32[2]) {{\n"
            "  %p = f32[8]{0} parameter(0)\n  %q = f32[2]{0} parameter(1)\n"
            "  %s = (f32[8]{0}, f32[2]{0}) all-reduce-start(%p, %q), replica_groups={{0,1}}, to_apply=%add\n"
            "  ROOT %d = (f32[8]{0}, f32[2]{0}) all-reduce-done(%s)\n}\n")
    _hlo.hlo_module_from_text(text)  # XLA reads it
    module = parse_hlo_text(text)
    s = module.instruction("s")
    assert message_bytes(module, s) == 40  # both results, not the second alone
    assert ici_bytes(module, s, 4) == 2 * 3 / 4 * 40
    assert module_costs(module)["s"].bytes_accessed == 80


COMPILES = glob_sets("compile_*/modules/*/hlo/*optimizations.txt", "compile_*/modules/*/optimized.hlo.txt")


def test_there_are_fixture_compiles_with_collectives():
    assert len(COMPILES) >= 10


def _own_computation_bytes(module, instr) -> int:
    """The message by the rule written out: operands looked up among the instructions of the
    collective's own computation (reduce-scatter), else the result (of an (operands, results)
    async start: the results)."""
    own = {i.name: i for i in module.computations[instr.computation].instructions}
    if V.collective_kind(instr.opcode) == "reduce-scatter":
        return sum(own[o].parsed_shape.bytes for o in instr.operands)
    shape = instr.parsed_shape
    if instr.opcode != "all-reduce-start" and instr.opcode.endswith("-start") and shape.is_tuple:
        return shape.tuple_shapes[1].bytes
    return shape.bytes


@pytest.mark.parametrize("path", COMPILES, ids=set_id)
def test_message_bytes_is_the_lookup_in_the_collectives_own_computation(path):
    module = read_hlo_file(path)
    for instr in module.instructions():
        if instr.opcode in V.COLLECTIVE_KINDS or instr.opcode in V.COLLECTIVE_START:
            assert message_bytes(module, instr) == _own_computation_bytes(module, instr), instr.name
            for n in (1, 2, 8):
                assert ici_bytes(module, instr, n) == (0.0 if n == 1 else bus_factor(V.collective_kind(instr.opcode), n)
                                                       * _own_computation_bytes(module, instr))


def test_walk_opens_nested_calls_depth_first_each_computation_once():
    text = """HloModule m

%inner (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%x)
}

%outer (y: f32[4]) -> f32[4] {
  %y = f32[4]{0} parameter(0)
  %f = f32[4]{0} fusion(%y), kind=kLoop, calls=%inner
  ROOT %e = f32[4]{0} exponential(%f)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %g = f32[4]{0} fusion(%p), kind=kLoop, calls=%outer
  ROOT %h = f32[4]{0} fusion(%g), kind=kLoop, calls=%outer
}
"""
    _hlo.hlo_module_from_text(text)
    module = parse_hlo_text(text)
    entry = module.entry.name
    assert [i.name for i in module.walk([entry])] == ["p", "g", "y", "f", "x", "n", "e", "h"]
    assert [i.name for i in module.walk([entry], depth=1)] == ["p", "g", "y", "f", "e", "h"]
    assert [i.name for i in module.walk([entry], into=("call",))] == ["p", "g", "h"]
    assert [i.name for i in module.walk(["outer", "nowhere"], depth=0)] == ["y", "f", "e"]
