"""Structural diff of two HLO modules: which instructions were added, removed, changed, or moved
into or out of fusions, with FLOPs, bytes and (where given) time on each side.

Reads two `parse.hlo` modules (and optional per-instruction times, seconds by instruction name);
returns a JSON-safe `tpudiag.hlo_diff/1` document (its fields: `diff_modules`). No I/O, no
rendering (that is `report/diff_render.py`), no matching (that is `hlo_match`: instructions are
paired by structure, never by name; see its docstring).

This half classifies the pairs `hlo_match` found:
- An op is `moved` when it sits in a fusion on one side and not on the other, or in fusions that
  are not each other's counterpart.
- A matched op is `changed` when its own shape, layout, attributes, constant value or operand
  wiring differ (an operand whose counterpart is not the other side's operand), not when only
  something upstream changed. A fusion is `changed` when its kind, shape or contents changed.
- What has no counterpart is `added` (only in B) or `removed` (only in A); the rest `unchanged`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.analyze.hlo.cost import module_costs
from tpudiag.results.hlo_diff import SCHEMA, ComputationPair, DiffSide, DiffSummary, HloDiff, Pair
from tpudiag.analyze.diff.match import Matcher, Node, Side, match_modules
from tpudiag.parse.hlo import HloModule
from tpudiag.text import clip
STATUSES = ("added", "removed", "changed", "moved", "unchanged")


@dataclass(frozen=True)
class DiffConfig:
    # Names listed in a fusion's "fused in"/"fused out" change before "(+N more)"; the rest is in
    # the pairs themselves.
    names_listed: int = 5
    # Characters of a constant's literal shown when its value changed (a weight matrix is MBs).
    literal_chars: int = 40
    # Characters of a shape shown in a change (a train step's root tuple is thousands long); the
    # pair's shape_a/shape_b keep it whole.
    shape_chars: int = 120


DEFAULT_DIFF_CONFIG = DiffConfig()


def _shape_changes(x: Node, y: Node, cfg: DiffConfig) -> list[str]:
    if x.shape_key != y.shape_key:
        return [f"shape {clip(x.shape_key, cfg.shape_chars, '...')} -> {clip(y.shape_key, cfg.shape_chars, '...')}"]
    if x.instr.shape != y.instr.shape:
        return [f"layout {clip(x.instr.shape, cfg.shape_chars, '...')} -> {clip(y.instr.shape, cfg.shape_chars, '...')}"]
    return []


def _names(nodes: list[Node], cfg: DiffConfig) -> str:
    shown = ", ".join(n.instr.name for n in nodes[:cfg.names_listed])
    return shown + (f" (+{len(nodes) - cfg.names_listed} more)" if len(nodes) > cfg.names_listed else "")


def _op_changes(m: Matcher, x: Node, y: Node, cfg: DiffConfig) -> list[str]:
    out = []
    if x.opcode != y.opcode:
        out.append(f"opcode {x.opcode} -> {y.opcode}")
    out += _shape_changes(x, y, cfg)
    if x.attr_key != y.attr_key:
        xa, ya = dict(x.attr_key), dict(y.attr_key)
        for k in sorted(set(xa) | set(ya)):
            if xa.get(k) != ya.get(k):
                out.append(f"{k} differs" if k == "backend_config" else f"{k} {xa.get(k, '-')} -> {ya.get(k, '-')}")
    if x.instr.literal != y.instr.literal and x.opcode != "parameter":
        out.append(f"value {clip(x.instr.literal, cfg.literal_chars, '...')} -> {clip(y.instr.literal, cfg.literal_chars, '...')}")
    elif x.opcode == "parameter" and x.instr.literal != y.instr.literal:
        out.append(f"parameter {x.instr.literal} -> {y.instr.literal}")
    if x.applied != y.applied:
        out.append("applied computation differs (" + ", ".join(y.called) + ")")
    if len(x.operands) != len(y.operands):
        out.append(f"operands {len(x.operands)} -> {len(y.operands)}")
    else:
        A, B = m.a.nodes, m.b.nodes
        for k, (ox, oy) in enumerate(zip(x.operands, y.operands)):
            if m.ab.get(ox) != oy and A[ox].h != B[oy].h:
                out.append(f"operand {k} {x.operand_names[k]} -> {y.operand_names[k]}")
    return out


def _fusion_changes(m: Matcher, fab: dict, x: Node, y: Node, changed_ops: set, cfg: DiffConfig) -> list[str]:
    out = []
    kx, ky = x.instr.fusion_kind, y.instr.fusion_kind
    if kx != ky:
        out.append(f"kind {kx} -> {ky}")
    out += _shape_changes(x, y, cfg)
    inner_x, inner_y = m.a.inner.get(x.idx, []), m.b.inner.get(y.idx, [])
    gone = [n for n in inner_x if n.idx not in m.ab or m.b.nodes[m.ab[n.idx]].container != y.idx]
    came = [n for n in inner_y if n.idx not in m.ba or fab.get(m.a.nodes[m.ba[n.idx]].container) != y.idx]
    if came:
        out.append(f"fused in: {_names(came, cfg)}")
    if gone:
        out.append(f"fused out: {_names(gone, cfg)}")
    changed = sum(1 for n in inner_y if n.idx in changed_ops)
    if changed:
        out.append(f"{changed} fused op{'s' if changed > 1 else ''} changed")
    return out


def _cost_fields(costs: dict, times: dict | None, node: Node | None) -> tuple:
    if node is None or not node.top_level:
        return None, None, None
    c = costs.get(node.instr.name)
    t = times.get(node.instr.name) if times else None
    return (int(c.flops) if c else None, int(c.bytes_accessed) if c else None,
            float(t) if t is not None else None)


def _side_doc(side: Side, costs: dict, times: dict | None) -> dict:
    entry = side.module.entry
    top = [n for n in side.nodes if n.top_level]
    count = sum(len(side.module.computations[c].instructions) for c in side.order)
    flops = sum(costs[i.name].flops for i in entry.instructions if i.name in costs)
    nbytes = sum(costs[i.name].bytes_accessed for i in entry.instructions if i.name in costs)
    time_s = None
    if times is not None:
        time_s = float(sum(times.get(n.instr.name, 0.0) for n in top))
    return {"module": side.module.name, "path": side.module.path, "instructions": count,
            "fusions": len(side.fusions), "fused_instructions": len(side.ops) - sum(n.top_level for n in side.ops),
            "flops": int(flops), "bytes_accessed": int(nbytes), "time_s": time_s}



def diff_modules(a: HloModule, b: HloModule, times_a: dict | None = None, times_b: dict | None = None,
                 config: DiffConfig = DEFAULT_DIFF_CONFIG) -> HloDiff:
    """The `tpudiag.hlo_diff/1` document of module `a` (before) against `b` (after).

    `times_a`/`times_b`: seconds per instruction name (a compile report's `estimated_s`, or a
    profile's measured time), for the instructions outside fusions; None where there are none.

    The document: `a`/`b` (module, path, instructions in executed computations, fusions, fused
    instructions, flops and bytes_accessed as `hlo_cost.total_cost` counts them, time_s: the sum
    of the given times or None); `summary` (how many pairs are added, removed, changed, moved,
    unchanged; moved_into_fusions, moved_out_of_fusions); `computations` (A's executed
    computations and their counterparts); `pairs`, in B's program order with A-only instructions
    after their predecessor: a, b (instruction names, None on the side without it), status,
    opcode, computation, fusion_a/fusion_b (the fusion it sits in), fusion_kind_a/b (of a fusion
    instruction), shape_a/b, operands_a/b, literal_a/b (constants, parameter numbers), op_name,
    source, changes (readable lines), flops_a/b, bytes_accessed_a/b, time_a_s/time_b_s (None
    inside fusions: the fusion carries them).
    """
    matching = match_modules(a, b)
    sa, sb, m = matching.a, matching.b, matching.ops
    fab, fba, comps = matching.fab, matching.fba, matching.computations
    costs_a, costs_b = module_costs(a), module_costs(b)

    def name(side: Side, idx: int) -> str | None:
        return side.nodes[idx].instr.name if idx >= 0 else None

    rows: list[tuple[tuple, dict]] = []
    changed_ops: set[int] = set()
    summary = dict.fromkeys(STATUSES, 0)
    summary.update(moved_into_fusions=0, moved_out_of_fusions=0)

    def row(x: Node | None, y: Node | None, status: str, changes: list[str]) -> dict:
        n = y if y is not None else x
        fx = _cost_fields(costs_a, times_a, x)
        fy = _cost_fields(costs_b, times_b, y)
        summary[status] += 1
        return {
            "a": x.instr.name if x else None, "b": y.instr.name if y else None, "status": status,
            "opcode": n.opcode, "computation": y.comp if y else comps.get(x.comp, x.comp),
            "fusion_a": name(sa, x.container) if x else None, "fusion_b": name(sb, y.container) if y else None,
            "fusion_kind_a": x.instr.fusion_kind if x and x.is_fusion else None,
            "fusion_kind_b": y.instr.fusion_kind if y and y.is_fusion else None,
            "shape_a": x.instr.shape if x else None, "shape_b": y.instr.shape if y else None,
            "operands_a": x.operand_names if x else None, "operands_b": y.operand_names if y else None,
            "literal_a": clip(x.instr.literal, config.literal_chars, "...") if x and x.instr.literal else None,
            "literal_b": clip(y.instr.literal, config.literal_chars, "...") if y and y.instr.literal else None,
            "op_name": n.op_name, "source": n.source, "changes": changes,
            "flops_a": fx[0], "flops_b": fy[0], "bytes_accessed_a": fx[1], "bytes_accessed_b": fy[1],
            "time_a_s": fx[2], "time_b_s": fy[2],
        }

    A, B = sa.nodes, sb.nodes
    op_rows = {}
    for x_idx, y_idx in m.ab.items():
        x, y = A[x_idx], B[y_idx]
        changes = _op_changes(m, x, y, config)
        fx = A[x.container] if x.container >= 0 else None
        fy = B[y.container] if y.container >= 0 else None
        moved = None
        if fx is None and fy is not None:
            moved = f"moved into fusion {fy.instr.name}"
            summary["moved_into_fusions"] += 1
        elif fx is not None and fy is None:
            moved = f"moved out of fusion {fx.instr.name}"
            summary["moved_out_of_fusions"] += 1
        elif fx is not None and fab.get(fx.idx) != fy.idx:
            moved = f"moved from fusion {fx.instr.name} to {fy.instr.name}"
        if moved:
            op_rows[y_idx] = (x, "moved", [moved] + changes)
            continue
        if changes:
            changed_ops.add(y_idx)  # for its fusion's "N fused ops changed"
        op_rows[y_idx] = (x, "changed" if changes else "unchanged", changes)

    # Program order of B; an op only in A goes after the A op before it that has a counterpart.
    def b_key(y: Node) -> tuple:
        return (sb.comp_rank[y.comp], y.idx, 0, 0)

    anchors: dict[int, tuple] = {}
    last, cur = None, None
    for x in sa.nodes:
        if x.comp != cur:
            cur, last = x.comp, None
        y_idx = (fab if x.is_fusion else m.ab).get(x.idx)
        if y_idx is not None and B[y_idx].comp == comps.get(x.comp):
            last = B[y_idx].idx
        elif y_idx is None:
            cb = comps.get(x.comp)
            rank = sb.comp_rank[cb] if cb is not None else len(sb.order) + sa.comp_rank[x.comp]
            anchors[x.idx] = (rank, -1 if last is None else last, 1, x.idx)

    for y in sb.nodes:
        if y.is_fusion:
            x_idx = fba.get(y.idx)
            if x_idx is None:
                rows.append((b_key(y), row(None, y, "added", [])))
            else:
                ch = _fusion_changes(m, fab, A[x_idx], y, changed_ops, config)
                rows.append((b_key(y), row(A[x_idx], y, "changed" if ch else "unchanged", ch)))
        elif y.idx in op_rows:
            x, status, changes = op_rows[y.idx]
            rows.append((b_key(y), row(x, y, status, changes)))
        else:
            rows.append((b_key(y), row(None, y, "added", [])))
    for x_idx, key in anchors.items():
        rows.append((key, row(A[x_idx], None, "removed", [])))
    rows.sort(key=lambda r: r[0])

    return HloDiff(
        schema=SCHEMA,
        a=DiffSide(**_side_doc(sa, costs_a, times_a)),
        b=DiffSide(**_side_doc(sb, costs_b, times_b)),
        summary=DiffSummary(**summary),
        computations=tuple(ComputationPair(a=ca, b=comps.get(ca)) for ca in sa.order)
        + tuple(ComputationPair(a=None, b=cb) for cb in sb.order if cb not in set(comps.values())),
        pairs=tuple(_pair(r) for _, r in rows),
    )


def _pair(row: dict) -> Pair:
    def tup(v):
        return None if v is None else tuple(v)

    return Pair(**{**row, "operands_a": tup(row["operands_a"]), "operands_b": tup(row["operands_b"]),
                   "changes": tuple(row["changes"])})
