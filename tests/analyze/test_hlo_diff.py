"""The structural HLO diff, on HLO that XLA wrote.

- Every fixture module (CPU and TPU dumps, before and after optimizations, the v5e compile
  fixture) diffed with itself: no change, every instruction paired with itself.
- The same modules with every instruction and computation renamed (numbers reversed, so that
  `fusion.12` and `fusion.13` trade places in name order), checked valid by XLA's own parser:
  still no change, and each instruction paired with its renamed self. Names play no part.
- Real changes compiled here on CPU: an extra `jnp.tanh` (one op added inside the fusion, its
  user rewired), a different reduction axis (the reduce changes its dimensions and shape).
- Fusion moves: XLA's CPU fusion choice switched by a compiler flag (YNNPACK fusion off: the dot
  leaves the fusion, the reduce goes to a fusion of its own), and the fixtures' before- vs
  after-optimizations HLO (CPU and TPU v5e), where the optimizer fuses what was loose.
- The renderers: text and Markdown list what changed; the HTML page is self-contained and escapes
  a `<script>` instruction name written into real HLO.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import pytest
from jaxlib import _hlo

from tests.conftest import ARTIFACTS
from tpudiag.analyze.hlo.cost import module_costs, total_cost
from tpudiag.analyze.diff.hlo_diff import SCHEMA, STATUSES
from tpudiag.results.hlo_diff import HloDiff
from tpudiag.analyze.diff.hlo_diff import diff_modules as _diff_modules
from tpudiag.parse.hlo import HloModule, parse_hlo_text, read_hlo_file
from tpudiag.report.diff_render import render_diff_html, render_diff_markdown, render_diff_text


def diff_modules(*args, **kwargs) -> dict:
    """The diff as its document: the tests read the JSON every consumer sees."""
    return _diff_modules(*args, **kwargs).to_dict()


HLO_FILES = sorted([p for p in ARTIFACTS.glob("*/hlo/*.txt") if "memory-usage" not in p.name]
                   + list(ARTIFACTS.glob("compile_v5e_collective/modules/*/optimized.hlo.txt")))
CHANGE_KEYS = ("added", "removed", "changed", "moved")
ids = lambda p: str(p.relative_to(ARTIFACTS))  # noqa: E731


def _counts(doc: dict) -> dict:
    return {k: doc["summary"][k] for k in CHANGE_KEYS}


def _by_status(doc: dict, status: str) -> list[dict]:
    return [p for p in doc["pairs"] if p["status"] == status]


def _cpu(f, *shapes, **options) -> HloModule:
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    text = jax.jit(f).lower(*args).compile(compiler_options=options or None).as_text()
    return parse_hlo_text(text, f"<cpu {f.__name__}>")


def _renamed(text: str, module: HloModule) -> tuple[str, dict[str, str]]:
    """Every instruction and computation renamed, consistently, numbers reversed: `fusion.12` ->
    `fusion.<N-12>`, `fusion` -> `fusion.<M>`; the result is still valid HLO."""
    names = {i.name for i in module.instructions()} | set(module.computations)
    top = max((int(m.group(1)) for n in names for m in [re.search(r"\.(\d+)$", n)] if m), default=0)

    def new(name: str) -> str:
        m = re.match(r"(.*)\.(\d+)$", name)
        return f"{m.group(1)}.{top + 1000 - int(m.group(2))}" if m else f"{name}.{top + 2000}"

    mapping = {n: new(n) for n in names}
    return re.sub(r"%([\w.\-]+)", lambda m: "%" + mapping.get(m.group(1), m.group(1)), text), mapping


# -- no change ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", HLO_FILES, ids=ids)
def test_a_module_diffed_with_itself_has_no_change(path):
    module = read_hlo_file(path)
    doc = diff_modules(module, read_hlo_file(path))
    assert doc["schema"] == SCHEMA
    assert _counts(doc) == dict.fromkeys(CHANGE_KEYS, 0) and not HloDiff.from_dict(doc).has_changes
    assert doc["summary"]["unchanged"] == len(doc["pairs"]) > 0
    assert all(p["a"] == p["b"] and not p["changes"] for p in doc["pairs"])
    assert doc["a"] == doc["b"] | {"path": doc["a"]["path"]}
    # Every instruction of the fusion bodies is one pair, but their parameters (they stand for the
    # fusion's operands) and nested fusions (inlined into the outer one).
    fused = {c for c in module.fused_computations() if module.computations[c].execution_thread is None}
    listed = [i for i in module.instructions() if i.computation in fused and i.opcode not in ("parameter", "fusion")]
    assert doc["a"]["fused_instructions"] == len(listed)
    # A name is listed once, except in a computation `call`ed from several places: each call is
    # inlined (as XLA's CallInliner does), so its instructions are listed once per call (docs/hlo.md).
    call_sites: dict[str, list[str]] = {}  # computation -> the computations that call it
    for i in module.instructions():
        if i.opcode == "call":
            for c in i.called:
                call_sites.setdefault(c, []).append(i.computation)

    def inlined(comp: str) -> int:  # how many copies of `comp` the inlining makes
        return sum(inlined(caller) for caller in call_sites[comp]) if comp in call_sites else 1

    comp_of = {i.name: i.computation for i in module.instructions()}
    names = [p["a"] for p in doc["pairs"]]
    assert all(names.count(n) == inlined(comp_of[n]) for n in set(names))


@pytest.mark.parametrize("path", HLO_FILES[::3] + [
    ARTIFACTS / "decoder/hlo/module_0006.jit_train_step.cpu_after_optimizations.txt",
    ARTIFACTS / "compile_v5e_collective/modules/08-jit_step/optimized.hlo.txt",
    ARTIFACTS / "tpu_v5e_step/hlo/module_0000.jit_step.cl_933746096.after_optimizations.txt",
], ids=ids)
def test_renaming_every_instruction_changes_nothing(path):
    text = path.read_text()
    module = parse_hlo_text(text, str(path))
    renamed, mapping = _renamed(text, module)
    _hlo.hlo_module_from_text(renamed)  # XLA's parser: still a valid module
    other = parse_hlo_text(renamed, "<renamed>")
    assert {i.name for i in other.instructions()} == {mapping[i.name] for i in module.instructions()}
    doc = diff_modules(module, other)
    assert _counts(doc) == dict.fromkeys(CHANGE_KEYS, 0)
    assert all(mapping[p["a"]] == p["b"] for p in doc["pairs"])  # each op found its own renamed self
    assert (doc["a"]["flops"], doc["a"]["bytes_accessed"]) == (doc["b"]["flops"], doc["b"]["bytes_accessed"])


# -- real changes -----------------------------------------------------------------------------------

def test_an_extra_tanh_is_one_added_op_and_its_rewired_user():
    def plain(x, w):
        return jnp.sum(jax.nn.relu(x @ w) * 2.0, axis=0)

    def with_tanh(x, w):
        return jnp.sum(jnp.tanh(jax.nn.relu(x @ w)) * 2.0, axis=0)

    a, b = _cpu(plain, (64, 128), (128, 256)), _cpu(with_tanh, (64, 128), (128, 256))
    doc = diff_modules(a, b)
    assert _counts(doc) == {"added": 1, "removed": 0, "changed": 2, "moved": 0}
    (added,) = _by_status(doc, "added")
    assert added["opcode"] == "tanh" and added["fusion_b"] is not None and added["op_name"].endswith("/tanh")
    by_opcode = {p["opcode"]: p for p in _by_status(doc, "changed")}
    assert set(by_opcode) == {"fusion", "multiply"}
    assert by_opcode["multiply"]["changes"] == [f"operand 0 {by_opcode['multiply']['operands_a'][0]} -> {added['b']}"]
    assert f"fused in: {added['b']}" in by_opcode["fusion"]["changes"]
    # The dot, relu and reduce are all still there, unchanged.
    unchanged = {p["opcode"] for p in _by_status(doc, "unchanged")}
    assert {"dot", "maximum", "reduce", "parameter"} <= unchanged


def test_a_different_reduction_axis_changes_the_reduce():
    a = _cpu(lambda x: jnp.sum(jnp.exp(x), axis=0), (64, 128))
    b = _cpu(lambda x: jnp.sum(jnp.exp(x), axis=1), (64, 128))
    doc = diff_modules(a, b)
    assert doc["summary"]["added"] == doc["summary"]["removed"] == 0
    reduce = next(p for p in doc["pairs"] if p["opcode"] == "reduce")
    assert reduce["status"] == "changed"
    assert "shape f32[128] -> f32[64]" in reduce["changes"] and "dimensions {0} -> {1}" in reduce["changes"]
    assert next(p for p in doc["pairs"] if p["opcode"] == "exponential")["status"] == "unchanged"


def test_times_and_costs_are_carried_per_op():
    a = _cpu(lambda x: jnp.tanh(x) @ x, (128, 128))
    costs = module_costs(a)
    top = [i.name for i in a.entry.instructions if i.opcode != "parameter"]
    times = {name: 1e-6 * (k + 1) for k, name in enumerate(top)}
    doc = diff_modules(a, a, times_a=times, times_b=times)
    assert doc["a"]["time_s"] == pytest.approx(sum(times.values()))
    total = total_cost(a)
    assert (doc["a"]["flops"], doc["a"]["bytes_accessed"]) == (total.flops, total.bytes_accessed)
    for p in doc["pairs"]:
        if p["a"] in times:
            assert p["time_a_s"] == p["time_b_s"] == times[p["a"]]
            assert p["flops_a"] == costs[p["a"]].flops and p["bytes_accessed_b"] == costs[p["a"]].bytes_accessed
        if p["fusion_a"] is not None:  # an op inside a fusion has no figures of its own
            assert p["flops_a"] is None and p["time_a_s"] is None
    assert json.loads(json.dumps(doc)) == doc


# -- fusion moves ------------------------------------------------------------------------------------

def test_a_compiler_flag_that_changes_fusion_decisions_moves_ops():
    def f(x, w):
        return jnp.sum(jnp.tanh(x @ w) * 2.0 + 1.0, axis=0)

    shapes = ((64, 128), (128, 256))
    # XLA:CPU puts dot, elementwise ops and the reduce in one YNNPACK fusion by default; with its
    # fusion type cleared (xla_cpu_experimental_ynn_fusion_type) it leaves the dot outside a
    # loop fusion and reduces in fusions of their own.
    a, b = _cpu(f, *shapes), _cpu(f, *shapes, xla_cpu_experimental_ynn_fusion_type="")
    doc = diff_modules(a, b)
    moved = {p["opcode"]: p for p in _by_status(doc, "moved")}
    assert doc["summary"]["moved"] > 0 and doc["summary"]["moved_out_of_fusions"] > 0
    assert moved["dot"]["fusion_a"] is not None and moved["dot"]["fusion_b"] is None
    assert moved["dot"]["changes"][0] == f"moved out of fusion {moved['dot']['fusion_a']}"
    assert moved["reduce"]["fusion_b"] not in (None, moved["reduce"]["fusion_a"])
    # The elementwise ops stay together: their fusion is matched and they are not moved.
    assert {p["opcode"] for p in _by_status(doc, "unchanged")} >= {"tanh", "multiply", "add"}


@pytest.mark.parametrize("before,after,fused_opcodes", [
    ("mlp/hlo/module_0006.jit_train_step.before_optimizations.txt",
     "mlp/hlo/module_0006.jit_train_step.cpu_after_optimizations.txt", {"dot", "reduce", "multiply"}),
    ("tpu_v5e_step/hlo/module_0000.jit_step.cl_933746096.before_optimizations.txt",
     "tpu_v5e_step/hlo/module_0000.jit_step.cl_933746096.after_optimizations.txt", {"tanh", "multiply", "reduce"}),
])
def test_optimization_fuses_what_was_loose(before, after, fused_opcodes):
    a, b = read_hlo_file(ARTIFACTS / before), read_hlo_file(ARTIFACTS / after)
    assert not a.fused_computations()
    doc = diff_modules(a, b)
    moved = _by_status(doc, "moved")
    assert doc["summary"]["moved_into_fusions"] == len(moved) > 0
    assert fused_opcodes <= {p["opcode"] for p in moved}
    b_fusions = {p["b"] for p in doc["pairs"] if p["opcode"] == "fusion"}
    for p in moved:
        assert p["fusion_a"] is None and p["fusion_b"] in b_fusions
        assert p["changes"][0] == f"moved into fusion {p['fusion_b']}"
    assert doc["summary"]["added"] >= doc["b"]["fusions"] == len(b_fusions)  # no fusion before


# -- renderers ---------------------------------------------------------------------------------------

def test_text_and_markdown_show_each_change():
    path = ARTIFACTS / "tpu_v5e_step/hlo/module_0000.jit_step.cl_933746096"
    a = read_hlo_file(path.with_name(path.name + ".before_optimizations.txt"))
    b = read_hlo_file(path.with_name(path.name + ".after_optimizations.txt"))
    diff = _diff_modules(a, b)
    doc = diff.to_dict()
    text = render_diff_text(diff)
    lines = text.splitlines()
    assert "@@ main.2 -> main.0_spmd @@" in lines
    tanh = next(p for p in doc["pairs"] if p["opcode"] == "tanh")
    assert f"  > {tanh['a']} -> {tanh['b']}  tanh  [bytes 2.0 MiB -> fused]" in lines
    assert f"        moved into fusion {tanh['fusion_b']}" in lines
    assert sum(ln.lstrip().startswith(("+ ", "- ", "~ ", "> ")) for ln in lines) == sum(_counts(doc).values())
    assert [p.status for p in diff.changed_pairs] == [p["status"] for p in doc["pairs"] if p["status"] != "unchanged"]
    md = render_diff_markdown(diff)
    assert f"**{doc['summary']['added']} added, {doc['summary']['removed']} removed" in md
    assert md.count("\n| moved |") == doc["summary"]["moved"]
    same = _diff_modules(a, a)
    assert render_diff_text(same).endswith("\nno change\n") and "No change." in render_diff_markdown(same)


def test_html_is_self_contained_and_escapes_names():
    path = ARTIFACTS / "tpu_v5e_step/hlo/module_0000.jit_step.cl_933746096.after_optimizations.txt"
    text = path.read_text()
    # A name no compiler writes, but HLO text can carry: the page must show it, not run it.
    evil = "<script>alert</script>"
    renamed = re.sub(r"%tanh\.3\.clone\.1\b", "%" + evil, text)
    assert renamed != text
    diff = _diff_modules(read_hlo_file(path), parse_hlo_text(renamed, "<b onload=x>.txt"))
    doc = diff.to_dict()
    assert any(p["b"] == evil for p in doc["pairs"])
    page = render_diff_html(diff)
    assert "<script" not in page.lower() and "&lt;script&gt;alert&lt;/script&gt;" in page
    assert "<b onload" not in page and "&lt;b onload=x&gt;.txt" in page
    assert not re.search(r"\b(src|href)=|https?://|@import|url\(", page)  # opens offline: nothing to fetch
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    rows = [r for r in re.findall(r'<tr class="(\w+)">', page) if r != "comp"]  # "comp": a computation's title row
    assert rows == [p["status"] for p in doc["pairs"]] and set(rows) <= set(STATUSES)
    assert not diff.has_changes  # a new name is no change


def test_op_names_are_the_models_unescaped_metadata():
    """XLA escapes quotes in metadata strings (`params[\\'w1\\']`); the diff shows each pair's
    op_name as `Instruction.metadata` reads it (`params['w1']`), the name jax gave the argument."""
    path = next(p for p in HLO_FILES if "\\'" in p.read_text() and "after_optimizations" in p.name)
    module = read_hlo_file(path)
    doc = diff_modules(module, module)
    by_name = {p["b"]: p["op_name"] for p in doc["pairs"]}
    quoted = [i for i in module.instructions() if "'" in i.metadata.get("op_name", "") and i.name in by_name]
    assert quoted, "the fixture has quoted argument names"
    for instr in quoted:
        assert by_name[instr.name] == instr.metadata["op_name"] and "\\" not in by_name[instr.name]
