"""Reads XLA's HLO text (as dumped by CPU, GPU and TPU compiles) into a small module model.

Returns `HloModule` objects: computations with their instructions (name, opcode, shape text,
operand names, called computations, fusion kind, metadata) and the source-location tables
(`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) that current dumps write at the
top of the module, so an instruction's `stack_frame_id` resolves to a Python `file:line`. Older
dumps write `source_file`/`source_line` inline in the metadata; both are handled.

The printers of the supported jax versions differ in one way the model must hide: from jax 0.12,
XLA prints an element of a tuple as an operand (`copy(%arg_tuple.6#7)`) where older versions print
a `get-tuple-element` instruction and use it. The parser turns the new spelling back into the
`get-tuple-element` XLA's own parser builds for it (named `arg_tuple.6_7`, `index=7`, the element's
shape), so both dumps give the same model.

The model itself (typed attribute fields, the cached def-use and call graphs) is
`parse.hlo_model`; the readers of brackets and attribute values are `parse.hlo_text`; both are
re-exported here. It does not compute costs or classify ops (that is `analyze/`). XLA's own parser
(`jaxlib._hlo.hlo_module_from_text`) is the oracle the tests hold this one to.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpudiag.errors import ParseError
from tpudiag.parse.hlo_model import RUNS_CALLEES, Computation, HloModule, Instruction, Use
from tpudiag.parse.hlo_text import (KV, ReplicaGroups, WindowDim, balanced, parse_replica_groups, split_top_level,
                                     unescape)

# The model and the attribute records are imported from here by every reader.
__all__ = ["RUNS_CALLEES", "Computation", "HloModule", "Instruction", "ReplicaGroups", "Use", "WindowDim",
           "find_optimized_modules", "parse_hlo_text", "parse_replica_groups", "read_hlo_file", "split_top_level",
           "tuple_element_shape"]

_HEADER = re.compile(r"^HloModule\s+([^\s,]+)")
_COMP_END = re.compile(r'^\},\s*execution_thread="([^"]*)"\s*$')
_COMP = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*(\(.*\))?\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$", re.S)  # re.S: multi-line backend configs
_COMMENT = re.compile(r"/\*.*?\*/")
_TABLE_ROW = re.compile(r"^([0-9]+)\s+(.*)$")
_LITERAL_OPCODES = frozenset({"parameter", "constant", "iota", "rng-get-and-update-state"})
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _parse_instruction(rest: str) -> tuple[str, str, list[str], str, str]:
    """`SHAPE opcode(operands), attrs` -> (shape, opcode, operands, attrs, literal)."""
    rest = rest.strip()
    if rest.startswith("("):
        shape = balanced(rest, 0, "(", ")")
        rest = rest[len(shape):].lstrip()
    else:
        # A shape has no spaces outside brackets: f32[8,128]{1,0:T(8,128)(2,1)S(1)}
        depth, i = 0, 0
        while i < len(rest) and not (rest[i] == " " and depth == 0):
            depth += rest[i] in "[{(" and 1 or (-1 if rest[i] in "]})" else 0)
            i += 1
        shape, rest = rest[:i], rest[i:].lstrip()
    m = re.match(r"([\w\-.]+)\(", rest)
    if not m:
        raise ValueError("expected `opcode(` after the shape")
    opcode = m.group(1)
    args = balanced(rest, m.end() - 1, "(", ")")
    attrs = rest[m.end() - 1 + len(args):].lstrip(", ")
    operands = []
    # parameter(0), constant({1,2}), iota(): the parenthesised text is a literal, not operands.
    for a in ([] if opcode in _LITERAL_OPCODES else split_top_level(args[1:-1])):
        a = a.strip()
        if not a:
            continue
        tok = a.split()[-1]
        operands.append(tok.lstrip("%") if (tok.startswith("%") or " " in a) else a)
    literal = args[1:-1] if opcode in _LITERAL_OPCODES else ""
    return shape, opcode, operands, attrs, literal


def _open_braces(line: str) -> int:
    """`{` minus `}` outside double-quoted strings (JSON strings never span lines)."""
    depth, quoted, escaped = 0, False, False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif not quoted:
            depth += (ch == "{") - (ch == "}")
    return depth


_TUPLE_OPERAND = re.compile(r"^(.+?)((?:#[0-9]+)+)$")


def tuple_element_shape(shape: str, index: int) -> str | None:
    """The text of element `index` of a tuple shape `(a, b, /*index=5*/c)`; None if not a tuple
    or out of range."""
    shape = _COMMENT.sub("", shape).strip()
    if not shape.startswith("("):
        return None
    elements = [e.strip() for e in split_top_level(shape[1:-1])]
    return elements[index] if 0 <= index < len(elements) else None


def _expand_tuple_element_operands(comp: Computation, path: str) -> None:
    """Replace each `%t#N` operand by a `get-tuple-element` of `t` (chained for `%t#N#M`), named and
    shaped as XLA's parser names and shapes it, inserted before its first user; one per element."""
    if not any("#" in o for i in comp.instructions for o in i.operands):
        return
    shapes = {i.name: i.shape for i in comp.instructions}
    out: list[Instruction] = []
    for instr in comp.instructions:
        for k, operand in enumerate(instr.operands):
            m = _TUPLE_OPERAND.match(operand)
            if not m:
                continue
            base = m.group(1)
            for index in (int(n) for n in m.group(2).lstrip("#").split("#")):
                name = f"{base}_{index}"
                if name not in shapes:
                    if base not in shapes:  # left as written: the readers name the undefined operand
                        break
                    element = tuple_element_shape(shapes[base], index)
                    if element is None:
                        raise ParseError(path, f"instruction {instr.name}: operand {operand} takes element {index} "
                                               f"of {base}, whose shape {shapes[base][:40]} has no such element",
                                         line=instr.line)
                    shapes[name] = element
                    out.append(Instruction(name=name, opcode="get-tuple-element", shape=element, operands=[base],
                                           computation=comp.name, attrs=f"index={index}", line=instr.line))
                base = name
            else:
                instr.operands[k] = base
        out.append(instr)
    comp.instructions[:] = out


def parse_hlo_text(text: str, path: str = "<string>") -> HloModule:
    # XLA ends a line only at "\n" (its printer escapes other line breaks inside strings).
    lines = [ln.removesuffix("\r") for ln in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another
    name, start = None, 0
    for n, ln in enumerate(lines):
        if ln.strip():
            m = _HEADER.match(ln.strip())
            if not m:
                raise ParseError(path, "expected an `HloModule NAME` header", line=n + 1, snippet=ln.strip())
            name, start = m.group(1), n + 1
            break
    if name is None:
        raise ParseError(path, "empty file: no HloModule")
    tables: dict[str, dict[int, str]] = {t: {} for t in _TABLES}
    comps: dict[str, Computation] = {}
    table, comp = None, None
    resume = start  # the next line not yet consumed by a multi-line instruction
    for n in range(start, len(lines)):
        if n < resume:
            continue
        raw = lines[n]
        if comp is not None and _open_braces(raw) > 0:
            # A custom call's backend config printed as a JSON object keeps its own line breaks
            # (megablox's cost estimate, before optimizations): the instruction ends where its
            # braces close.
            depth, j = _open_braces(raw), n
            while depth > 0 and j + 1 < len(lines):
                j += 1
                depth += _open_braces(lines[j])
            raw, resume = "\n".join(lines[n:j + 1]), j + 1
        ln = raw.strip()
        if not ln or ln.startswith("//"):
            table = None if not ln else table
            continue
        if comp is None:
            if ln in _TABLES:
                table = ln
                continue
            if table is not None:
                m = _TABLE_ROW.match(ln)
                if not m:
                    raise ParseError(path, f"bad row in the {table} table", line=n + 1, snippet=ln)
                tables[table][int(m.group(1))] = m.group(2)
                continue
            m = _COMP.match(ln)
            if not m:
                raise ParseError(path, "expected a computation header `NAME (...) -> SHAPE {`", line=n + 1, snippet=ln)
            comp = Computation(name=m.group(2), is_entry=bool(m.group(1)))
            comps[comp.name] = comp
            continue
        if ln == "}" or _COMP_END.match(ln):
            if ln != "}":  # `}, execution_thread="sparsecore"`: v6e SparseCore offload (libtpu 0.0.42)
                comp.execution_thread = _COMP_END.match(ln).group(1)
            _expand_tuple_element_operands(comp, path)
            comp = None
            continue
        m = _INSTR.match(raw)
        if not m:
            raise ParseError(path, "expected an instruction `name = shape opcode(operands)`", line=n + 1, snippet=ln)
        try:
            # XLA writes `/*index=5*/` markers into long operand lists.
            shape, opcode, operands, attrs, literal = _parse_instruction(_COMMENT.sub("", m.group(3)))
        except ValueError as e:
            raise ParseError(path, f"malformed instruction: {e}", line=n + 1, snippet=ln) from None
        md_at = attrs.find("metadata={")
        if md_at >= 0:  # checked here so that reading `.metadata` later cannot fail
            try:
                balanced(attrs, md_at + len("metadata="), "{", "}")
            except ValueError:
                raise ParseError(path, "unterminated metadata={...}", line=n + 1, snippet=ln) from None
        comp.instructions.append(Instruction(name=m.group(2), opcode=opcode, shape=shape, operands=operands,
                                             computation=comp.name, attrs=attrs, is_root=bool(m.group(1)), line=n + 1,
                                             literal=literal))
    if comp is not None:
        raise ParseError(path, f"truncated: computation {comp.name!r} is not closed", line=len(lines), snippet=lines[-1])
    if not comps:
        raise ParseError(path, "no computations in the module", line=len(lines))

    def kv_table(t: str) -> dict[int, dict[str, str]]:
        return {k: dict(KV.findall(v)) for k, v in tables[t].items()}

    return HloModule(
        name=name, path=path, computations=comps,
        # Non-ASCII paths come as escaped bytes (`caf\\303\\251/x.py`): one name for one file.
        file_names={k: unescape(v.strip('"')) for k, v in tables["FileNames"].items()},
        function_names={k: unescape(v.strip('"')) for k, v in tables["FunctionNames"].items()},
        file_locations=kv_table("FileLocations"), stack_frames=kv_table("StackFrames"),
    )


def read_hlo_file(path: Path) -> HloModule:
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ParseError(path, "not text: an HLO module is a text file") from None
    except OSError as e:
        raise ParseError(path, f"cannot read ({e.strerror})") from None
    return parse_hlo_text(text, str(path))


_DUMP_NAME = re.compile(r"^module_(\d+)\.(.+?)\.(\w+_)?after_optimizations\.txt$")


def find_optimized_modules(dump_dir: Path) -> dict[int, Path]:
    """program_id -> the after-optimizations HLO file in an `--xla_dump_to` directory."""
    out: dict[int, Path] = {}
    if not dump_dir.is_dir():
        return out
    for p in dump_dir.iterdir():
        m = _DUMP_NAME.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


_UNOPTIMIZED_NAME = re.compile(r"^module_(\d+)\.(.+?)\.before_optimizations\.txt$")


def find_unoptimized_modules(dump_dir: Path) -> dict[int, Path]:
    """program_id -> the before-optimizations HLO file in an `--xla_dump_to` directory."""
    if not dump_dir.is_dir():
        return {}
    return {int(m.group(1)): p for p in dump_dir.iterdir() if (m := _UNOPTIMIZED_NAME.match(p.name))}


_MEMORY_REPORT = re.compile(r"^module_(\d+)\.(.+?)\.(\w+_)?after_optimizations-memory-usage-report\.txt$")
_TOTAL_BYTES = re.compile(r"^Total bytes: (\d+)\b", re.M)


def find_memory_reports(dump_dir: Path) -> dict[int, Path]:
    """program_id -> XLA's buffer-assignment memory report (`*-memory-usage-report.txt`) in a dump directory."""
    out: dict[int, Path] = {}
    if dump_dir.is_dir():
        for p in dump_dir.iterdir():
            m = _MEMORY_REPORT.match(p.name)
            if m:
                out[int(m.group(1))] = p
    return out


def read_allocated_bytes(path: Path) -> int:
    """The bytes XLA's buffer assignment allocates for a module: the sum of each memory space's
    `Total bytes:` line in its memory report. A file without one is a ParseError naming it."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise ParseError(path, f"cannot read: {e.strerror}") from None
    totals = [int(v) for v in _TOTAL_BYTES.findall(text)]
    if not totals:
        raise ParseError(path, "no 'Total bytes:' line: not an XLA memory-usage report")
    return sum(totals)


_DEFAULT_SPACE = re.compile(r"^Memory Space: default\b.*\n\s*Total bytes: (\d+)\b", re.M)


def read_hbm_allocated_bytes(path: Path) -> int | None:
    """The bytes XLA's buffer assignment gives the default memory space (HBM on a TPU) in a module's
    memory report: the figure the TPU compiler's out-of-memory check compares with the device's usable
    HBM (a module needing more fails with this number as "HLO temporaries (N G)"). None for a report
    without a default space; an unreadable file is a ParseError naming it."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise ParseError(path, f"cannot read: {e.strerror}") from None
    m = _DEFAULT_SPACE.search(text)
    return int(m.group(1)) if m else None
