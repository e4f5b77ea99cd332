"""The fusion table and the fusion breaks, held to XLA's own parser and to programs compiled here.

Oracles:
- XLA's parser (`jaxlib._hlo.hlo_module_from_text`) on every optimized fixture module, CPU and TPU:
  which fusions exist outside fusion bodies (`make_nonfusion_computations`), every operand edge,
  and the computations that while/call/conditional run. Every fusion is a row exactly once; every
  break's producer -> via -> consumer chain is made of real links (an operand, a call into a
  computation's parameter, a computation's root back to its caller); every direct edge between two
  real instructions is a break, and no other direct edge is.
- `hlo_cost`: bytes_in + bytes_out is its `bytes_accessed` exactly; where a fusion reads each
  operand plainly (no slicing, broadcast or reshape user, no non-scalar constant), bytes_in is the
  operands' logical bytes as XLA prints their shapes, and bytes_out the output's.
- Programs compiled in the test, whose breaks can be checked by hand: a layernorm on CPU (the mean
  is a reduce whose result two fusions broadcast back), the same on a TPU v5e (libtpu's
  compile-only client), a Pallas kernel between two ops (a custom call on both of its edges), and
  the fixtures' while loop and all-reduces.
"""

from __future__ import annotations

import importlib.util
import io
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxlib import _hlo
from rich.console import Console

from tests.conftest import ARTIFACTS
from tpudiag.analyze.hlo.fusions import (COLLECTIVE, CUSTOM_CALL, LOOP, MISMATCHED, NOT_INFERABLE, REASONS,
                                         REDUCE_BROADCAST, SCHEMA, SEVERAL_USERS, build_fusion_report, fusion_breaks,
                                         fusion_table)
from tpudiag.analyze.hlo.cost import module_costs
from tpudiag.parse.hlo import parse_hlo_text, read_hlo_file
from tpudiag.parse.shapes import parse_shape
from tpudiag.report.fusions_render import render_fusions_markdown, render_fusions_terminal

CPU_FILES = sorted(p for p in ARTIFACTS.glob("*/hlo/*after_optimizations.txt") if "cpu_after" in p.name)
TPU_FILES = sorted([p for p in ARTIFACTS.glob("*/hlo/*after_optimizations.txt") if "cpu_after" not in p.name]
                   + list(ARTIFACTS.glob("compile_v5e_collective/modules/*/optimized.hlo.txt")))
HLO_FILES = CPU_FILES + TPU_FILES
COLLECTIVE_STEP = ARTIFACTS / "compile_v5e_collective" / "modules" / "08-jit_step" / "optimized.hlo.txt"
TPU_LOOP = next(ARTIFACTS.glob("llo_v5e/hlo/*jit_loop*after_optimizations.txt"))

# What the oracle calls a real producer and a real consumer, written from the HLO semantics
# independently of the module under test: views, tuples, literals, ids, control flow and the
# starting halves of async pairs make no tensor; views, tuples and control flow read none.
_NO_TENSOR = {"parameter", "constant", "partition-id", "replica-id", "rng-get-and-update-state",
              "get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done", "after-all", "add-dependency",
              "opt-barrier", "domain", "while", "call", "conditional", "async-update", "send", "send-done", "recv"}
_NO_READ = {"get-tuple-element", "tuple", "bitcast", "copy-start", "copy-done", "opt-barrier", "domain", "while",
            "call", "conditional", "after-all", "add-dependency"}
_SPELLING = {"log1p": "log-plus-one", "expm1": "exponential-minus-one", "exp": "exponential",
             "optimization-barrier": "opt-barrier", "population-count": "popcnt"}


def _opcode(enum) -> str:
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", enum.name[1:]).lower()
    return _SPELLING.get(kebab, kebab)


def _shape_text(line: str) -> str:
    """The shape XLA printed in `%name = SHAPE opcode(...)`."""
    rest = line.split(" = ", 1)[1]
    if rest.startswith("("):
        depth = 0
        for k, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                return rest[:k + 1]
    return rest.split(" ", 1)[0]


class Oracle:
    """XLA's parse of the module: instructions, operands, users, computations and who calls them."""

    def __init__(self, text: str):
        module = _hlo.hlo_module_from_text(text)
        self.op, self.operands, self.comp, self.line, self.root = {}, {}, {}, {}, {}
        self.params: dict[str, list[str]] = {}
        for c in module.computations():
            for i in c.instructions():
                self.op[i.name] = _opcode(i.opcode)
                self.operands[i.name] = [o.name for o in i.operands()]
                self.comp[i.name] = c.name
                self.line[i.name] = i.to_string()
                if self.op[i.name] == "parameter":
                    self.params.setdefault(c.name, []).append(i.name)
        # The root as XLA prints it (`ROOT %name = ...`) in its own rendering of the module.
        for m in re.finditer(r"^\s+ROOT %?([^\s=]+) =", module.to_string(), re.M):
            self.root[self.comp[m.group(1)]] = m.group(1)
        self.nonfusion = [c.name for c in module.make_nonfusion_computations()]
        self.runs: dict[str, list[str]] = {}  # while/call/conditional -> computations it runs
        reducers = set()
        for name, line in self.line.items():
            keys = ("body", "condition", "to_apply", "branch_computations", "true_computation", "false_computation")
            called = []
            for key in keys:
                m = re.search(rf"\b{key}=(\{{[^}}]*\}}|[^\s,]+)", line)
                if m:
                    called += [x.strip().lstrip("%") for x in m.group(1).strip("{}").split(",") if x.strip()]
            if self.op[name] in ("while", "call", "conditional"):
                self.runs[name] = called
            elif "to_apply=" in line:
                reducers |= set(called)
        self.executed = [c for c in self.nonfusion if c not in reducers]

    def shape(self, name: str):
        return parse_shape(_shape_text(self.line[name]))


def _oracle(path) -> Oracle:
    return Oracle(path.read_text())


@pytest.fixture(scope="module")
def parsed():
    cache = {}

    def get(path):
        if path not in cache:
            module = read_hlo_file(path)
            cache[path] = (module, fusion_table(module), fusion_breaks(module), _oracle(path))
        return cache[path]
    return get


def _ids(p):
    return f"{p.parent.parent.name}/{p.parent.name}/{p.name}"


def test_there_are_cpu_and_tpu_fixtures():
    assert len(CPU_FILES) >= 8 and len(TPU_FILES) >= 8


# -- the fusion table ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", HLO_FILES, ids=_ids)
def test_every_executed_fusion_is_one_row(path, parsed):
    module, rows, _, oracle = parsed(path)
    expected = sorted(n for n, op in oracle.op.items() if op == "fusion" and oracle.comp[n] in oracle.executed)
    assert sorted(r["name"] for r in rows) == expected
    for r in rows:
        assert r["kind"] in ("kLoop", "kInput", "kOutput", "kCustom")
        assert r["time_s"] is None and r["time_source"] is None
        assert "parameter" not in r["ops"] and "fusion" not in r["ops"] and all(n > 0 for n in r["ops"].values())


def _check_bytes(module, rows, oracle) -> int:
    """Checks every row against hlo_cost, and the plain ones against XLA's printed shapes; returns
    how many were plain."""
    costs = module_costs(module)
    plain = 0
    for r in rows:
        cost = costs[r["name"]]
        assert r["bytes_in"] + r["bytes_out"] == cost.bytes_accessed
        assert r["flops"] == cost.flops and r["bytes_in"] >= 0 and r["bytes_out"] >= 0
        if r["arithmetic_intensity"] is not None:
            assert r["arithmetic_intensity"] == pytest.approx(cost.flops / cost.bytes_accessed)
        # Independent figures where the fusion reads each operand once and writes each output once.
        body = re.search(r"\bcalls=%?([^\s,]+)", oracle.line[r["name"]]).group(1)
        inside = [n for n, c in oracle.comp.items() if c == body]
        users = {n: [u for u in inside if n in oracle.operands[u]] for n in inside}
        params = [n for n in inside if oracle.op[n] == "parameter"]
        reads_plainly = all(oracle.op[u] not in ("slice", "dynamic-slice", "dynamic-update-slice", "broadcast",
                                                 "reshape", "fusion", "get-tuple-element", "gather", "scatter")
                            for p in params for u in users[p])
        big_constant = any(oracle.op[n] == "constant" and oracle.shape(n).elements > 1 for n in inside)
        root = oracle.root[body]
        dus_root = oracle.op[root] == "dynamic-update-slice" or (
            oracle.op[root] == "tuple" and any(oracle.op[o] == "dynamic-update-slice" for o in oracle.operands[root]))
        if reads_plainly and not big_constant and not dus_root and r["kind"] != "kCustom":
            plain += 1
            operands = dict.fromkeys(oracle.operands[r["name"]])
            assert r["bytes_in"] == sum(oracle.shape(o).bytes for o in operands), r["name"]
            assert r["bytes_out"] == oracle.shape(r["name"]).bytes, r["name"]
    return plain


@pytest.mark.parametrize("path", HLO_FILES, ids=_ids)
def test_bytes_agree_with_the_cost_model(path, parsed):
    module, rows, _, oracle = parsed(path)
    _check_bytes(module, rows, oracle)


def test_the_independent_bytes_check_covers_many_fusions(parsed):
    plain = total = 0
    for path in HLO_FILES:
        module, rows, _, oracle = parsed(path)
        plain += _check_bytes(module, rows, oracle)
        total += len(rows)
    assert total >= 100 and plain >= total // 3, (plain, total)


def test_times_and_sources_pass_through(parsed):
    module, rows, _, _ = parsed(COLLECTIVE_STEP)
    last = rows[-1]["name"]
    timed = fusion_table(module, {last: 2.5e-6, "not-a-fusion": 1.0}, time_source="estimated")
    assert timed[0]["name"] == last and timed[0]["time_s"] == 2.5e-6 and timed[0]["time_source"] == "estimated"
    assert all(r["time_s"] is None and r["time_source"] is None for r in timed[1:])
    by_name = {r["name"]: r for r in rows}
    # fused_computation.5: the dot (collective.py:32 via its frames), tanh, and two reduce_sums.
    assert by_name["fusion"]["ops"] == {"bitcast": 2, "reduce": 2, "constant": 1, "convolution": 1, "tanh": 1,
                                        "tuple": 1}
    assert by_name["fusion"]["sources"][0] == "fixtures/programs/collective.py:32"
    assert set(by_name["fusion"]["sources"]) <= {f"fixtures/programs/collective.py:{n}" for n in (32, 34, 38)}


# -- the fusion breaks -----------------------------------------------------------------------------


def _link_ok(oracle: Oracle, a: str, b: str) -> bool:
    if a in oracle.operands[b]:
        return True  # b reads a
    if b in oracle.params.get(oracle.comp[b], []) and oracle.comp[b] in oracle.runs.get(a, []):
        return True  # a (while/call/conditional) passes its operand into the computation b belongs to
    return oracle.root.get(oracle.comp[a]) == a and oracle.comp[a] in oracle.runs.get(b, [])  # a leaves for b


@pytest.mark.parametrize("path", HLO_FILES, ids=_ids)
def test_every_break_is_a_real_edge(path, parsed):
    module, _, breaks, oracle = parsed(path)
    for b in breaks:
        p, c = b["producer"], b["consumer"]
        assert oracle.op[p] not in _NO_TENSOR and oracle.op[c] not in _NO_READ and p != c
        assert oracle.comp[p] in oracle.executed and oracle.comp[c] in oracle.executed
        chain = [p, *b["via"], c]
        assert all(_link_ok(oracle, x, y) for x, y in zip(chain, chain[1:])), chain
        leaf = oracle.shape(p) if b["output_index"] is None else oracle.shape(p).tuple_shapes[b["output_index"]]
        assert b["bytes"] == leaf.bytes and b["shape"] == f"{leaf.element_type}[{','.join(map(str, leaf.dims))}]"
        assert b["memory_space"] == leaf.memory_space
    assert [b["bytes"] for b in breaks] == sorted((b["bytes"] for b in breaks), reverse=True)


@pytest.mark.parametrize("path", HLO_FILES, ids=_ids)
def test_direct_edges_are_exactly_the_oracles(path, parsed):
    """Every operand edge from a real producer to a real reader, in an executed computation, is a
    break with an empty `via`; and the module reports no other direct edge."""
    module, _, breaks, oracle = parsed(path)
    expected = set()
    for c_name in oracle.executed:
        for name, comp in oracle.comp.items():
            if comp != c_name or oracle.op[name] in _NO_READ:
                continue
            for o in oracle.operands[name]:
                tuple_out = oracle.shape(o).is_tuple
                token = _shape_text(oracle.line[o]).startswith("token")  # an ordering edge, no data
                if oracle.op[o] not in _NO_TENSOR and not oracle.op[o].endswith("-start") and not tuple_out \
                        and not token and o != name:
                    expected.add((o, name))
    direct = {(b["producer"], b["consumer"]) for b in breaks if not b["via"]}
    assert direct == expected


@pytest.mark.parametrize("path", HLO_FILES, ids=_ids)
def test_reasons_come_from_the_list_with_evidence(path, parsed):
    module, _, breaks, oracle = parsed(path)
    for b in breaks:
        assert set(b["reasons"]) <= set(REASONS) and len(set(b["reasons"])) == len(b["reasons"])
        assert b["reason"] == (b["reasons"][0] if b["reasons"] else NOT_INFERABLE)
        assert b["reasons"] == [r for r in REASONS if r in b["reasons"]]  # in the documented order
        assert b["evidence"]
        assert (SEVERAL_USERS in b["reasons"]) == (b["users"] > 1)
        kinds = {oracle.op[b["producer"]], oracle.op[b["consumer"]]}
        custom = "custom-call" in kinds or any(
            oracle.op[x] == "fusion" and "kind=kCustom" in oracle.line[x] for x in (b["producer"], b["consumer"]))
        assert (CUSTOM_CALL in b["reasons"]) == custom
        if LOOP in b["reasons"]:
            assert any(oracle.op.get(v) == "while" for v in b["via"])
        if MISMATCHED in b["reasons"]:
            assert b["shape"] in b["evidence"]


def test_loop_breaks_in_a_tpu_while_loop(parsed):
    """fori_loop(h = tanh(h @ w)) on v5e: the new h is carried to the next iteration, where a copy
    reads it; x enters the loop through the copy XLA made of it."""
    module, _, breaks, _ = parsed(TPU_LOOP)
    by_edge = {(b["producer"], b["consumer"]): b for b in breaks}
    carried = by_edge[("convolution_tanh_fusion.2", "copy.11")]
    assert carried["reason"] == LOOP and "carried to the next iteration of while `while`" in carried["evidence"]
    assert carried["users"] == 2 and "the program's output" in carried["evidence"]
    assert carried["bytes"] == 256 * 512 * 2 and carried["memory_space"] == 1
    enters = by_edge[("copy.9", "copy.11")]
    assert enters["reason"] == LOOP and "enters while `while`" in enters["evidence"]


def test_collective_breaks(parsed):
    module, _, breaks, _ = parsed(COLLECTIVE_STEP)
    by_edge = {(b["producer"], b["output_index"], b["consumer"]): b for b in breaks}
    into = by_edge[("fusion", 1, "all-reduce.4")]  # the reduce_sum over axis 0 goes into the psum
    assert into["reason"] == COLLECTIVE and into["via"] == ["get-tuple-element.3"] and into["bytes"] == 256 * 4
    out = by_edge[("all-reduce.4", 0, "broadcast_multiply_fusion.1")]
    assert out["reason"] == COLLECTIVE and "producer `all-reduce.4` is a collective" in out["evidence"]
    # The (32, 256) tanh output read by the abs/reduce fusion: one user, same elements, no boundary.
    plain = by_edge[("fusion", 2, "abs_reduce_fusion")]
    assert plain["reason"] == NOT_INFERABLE and plain["bytes"] == 32 * 256 * 4 and plain["reasons"] == []


def _layernorm(x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5)


def test_layernorm_on_cpu_reduction_feeding_a_broadcast():
    """XLA:CPU computes the mean's sum in a YNNPACK fusion (kCustom) that reads x, and two loop
    fusions broadcast it back over the rows: 256 floats, two users, each edge a reduce feeding a
    broadcast (and the library call's boundary)."""
    text = jax.jit(_layernorm).lower(jax.ShapeDtypeStruct((256, 512), jnp.float32)).compile().as_text()
    module = parse_hlo_text(text, "<cpu layernorm>")
    breaks = fusion_breaks(module)
    x = next(i.name for i in module.entry.instructions if i.opcode == "parameter")
    reduces = [i for i in module.entry.instructions if i.opcode == "fusion" and i.operands[0] == x
               and any(j.opcode == "reduce" and j.is_root for j in module.computations[i.called[0]].instructions)]
    assert len(reduces) == 1
    mean = reduces[0].name
    out = [b for b in breaks if b["producer"] == mean]
    assert len(out) == 2
    for b in out:
        assert b["shape"] == "f32[256]" and b["bytes"] == 1024 and b["users"] == 2
        assert REDUCE_BROADCAST in b["reasons"] and SEVERAL_USERS in b["reasons"] and CUSTOM_CALL in b["reasons"]
        assert f"`{mean}` outputs reduce" in b["evidence"] and f"`{b['consumer']}` broadcasts it" in b["evidence"]
    # Source lines are this file's layernorm, most frequent first.
    lines, start = inspect.getsourcelines(_layernorm)
    table = fusion_table(module)
    here = {f"{__file__}:{n}" for n in range(start, start + len(lines))}
    assert all(set(r["sources"]) <= here and r["sources"] for r in table)


@pytest.fixture(scope="module")
def tpu_mesh():
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install tpudiag[tpu]): no TPU compiles")
    from jax.experimental import topologies
    from jax.sharding import Mesh

    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
    return Mesh(np.array(topo.devices[:1]).reshape(1), ("d",))


def _compile_tpu(mesh, f, shape, dtype):
    from jax.sharding import NamedSharding, PartitionSpec

    arg = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))
    return parse_hlo_text(jax.jit(f).trace(arg).lower(lowering_platforms=("tpu",)).compile().as_text(), "<tpu>")


def test_layernorm_on_tpu_statistics_broadcast_back(tpu_mesh):
    """On v5e, rsqrt(var + eps) is a fusion of its own between the variance's reduce fusion and
    the fusion that broadcasts it over the rows: the reduce is one hop upstream."""
    module = _compile_tpu(tpu_mesh, lambda x: _layernorm(x.astype(jnp.float32)).astype(jnp.bfloat16),
                          (512, 1024), jnp.bfloat16)
    breaks = fusion_breaks(module)
    out_root = next(i for i in module.entry.instructions if i.is_root)
    into_out = [b for b in breaks if b["consumer"] == out_root.name and REDUCE_BROADCAST in b["reasons"]]
    assert into_out, [(b["producer"], b["consumer"], b["reasons"]) for b in breaks]
    for b in into_out:
        assert b["shape"] == "f32[512]" and "broadcasts it" in b["evidence"] and "reduce `" in b["evidence"]
    assert all(MISMATCHED in b["reasons"] for b in into_out)  # 512 elements into a 512x1024 loop


def test_pallas_kernel_is_a_custom_call_boundary(tpu_mesh):
    from jax.experimental import pallas as pl

    def double_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        y = pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(jnp.tanh(x))
        return jnp.exp(y)

    module = _compile_tpu(tpu_mesh, f, (256, 512), jnp.float32)
    call = next(i for i in module.entry.instructions if i.opcode == "custom-call")
    breaks = fusion_breaks(module)
    assert {(b["producer"] == call.name, b["consumer"] == call.name) for b in breaks} == {(False, True), (True, False)}
    for b in breaks:
        assert b["reason"] == CUSTOM_CALL and "`tpu_custom_call`" in b["evidence"] and b["bytes"] == 256 * 512 * 4


# -- the document and its renderers ----------------------------------------------------------------


def test_document_and_renderers(parsed):
    module, rows, breaks, _ = parsed(COLLECTIVE_STEP)
    doc = build_fusion_report(module).to_dict()
    assert doc["schema"] == SCHEMA and doc["module"]["name"] == "jit_step"
    assert doc["fusions"] == rows and doc["breaks"] == breaks
    assert doc["totals"]["breaks"] == len(breaks) and doc["totals"]["break_bytes"] == sum(b["bytes"] for b in breaks)

    console = Console(width=200, color_system=None, record=True, force_terminal=False, file=io.StringIO())
    report = build_fusion_report(module)
    render_fusions_terminal(report, console, top=3)
    text = console.export_text()
    assert "tpudiag fusions: jit_step" in text
    assert "fusion#2 → abs_reduce_fusion" in text and "reason not inferable" in text
    assert f"{len(breaks) - 3} more breaks in the JSON" in text and "S(1) is on-chip VMEM" in text

    for f in report.fusions:  # the renderers list opcodes most frequent first, ties by name
        ranked = f.ranked_ops
        assert dict(ranked) == f.ops
        assert all(n > m or (n == m and a < b) for (a, n), (b, m) in zip(ranked, ranked[1:]))

    md = render_fusions_markdown(report, top=3, level=3)
    assert md.startswith("### Fusions: `jit_step`")
    table = [ln for ln in md.splitlines() if re.match(r"\| \d", ln) and "→" in ln]
    assert len(table) == 3
    assert table[0].startswith("| 32.0 KiB | `fusion#2 → abs_reduce_fusion` | `f32[32,256]` | S(1) |")
    assert "| `fusion` | kOutput | - | 288.0 KiB | 33.1 KiB | 12.8 |" in md
