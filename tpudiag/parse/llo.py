"""Reads what libtpu's TPU compiler dumps about its LLO (low-level) programs into DataFrames.

Reads three artifacts of a TPU compile (see fixtures/programs/tpu_compile_dump.py for the flags):

- `read_static_profiles(dir)`: the `--xla_jf_dump_static_llo_profile_to` directory, one
  `<op>_static_llo_profile.textproto` per HLO op, into a STATIC_PROFILES frame (one row per
  `hlo_op_estimate`: the compiler's static cycle estimate for that op).
- `read_llo_dump(dir)`: the `--xla_jf_dump_to` directory written with
  `--xla_jf_dump_llo_text=true` and the pass-label regex
  `final_bundles|final_hlo-static-per-bundle-utilization`, into an LLO_PROGRAMS frame: one row per
  LLO program (an HLO op, a module's top-level program `TLP`, or its `<late-initialization>` and
  `<late-finalization>` programs) with its bundle count, per-slot VLIW utilization, spills, loops
  and a few instruction counts.
- `read_vmem_report(path)`: one `*-vmem_report.html`, into a dict of per-op VMEM bytes.

Every malformed file raises `ParseError` naming the file and, where there is one, the line. The
figures are the compiler's static view of one program run, not measurements; this module does not
convert cycles to time, join ops to HLO or judge anything (that is `analyze/`). The static
profile names ops but not their module, so this module does not attribute them to one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from tpudiag.errors import InputError, ParseError
from tpudiag.parse.frames import check_frame, empty_frame

# One row per `hlo_op_estimate` message of a static LLO profile.
STATIC_PROFILES = {
    "op": "object",                    # HLO instruction name (`hlo_op_name`), e.g. "fusion.4"
    "estimated_cycles": "int64",       # TPU core cycles, the compiler's static estimate for one run of the op
    "num_equivalent_hlos": "int64",    # count of HLO ops the estimate stands for (0 when the file omits it)
    "dma_instruction_type": "object",  # e.g. "DMA_INSTRUCTION_TYPE_LOCAL"; "" when the file omits it
    "estimate_missing": "bool",        # 0 cycles with a REMOTE DMA type: "not estimated", not "free" (TPU-NOTES)
    "file": "object",                  # the textproto's file name
}

# The VLIW slots of the capacity line, as lowercase ids (`VLOAD:FILL` -> `vload_fill`). libtpu 0.0.42
# writes these ten for v3, v4, v5e, v5p and v6e alike; a slot missing from a dump gets cap 0 and
# util NaN, and a slot not listed here still gets its own `cap_`/`util_` columns.
SLOTS = ("mxu", "xlu", "valu", "vpop", "eup", "vload", "vload_fill", "vstore", "vstore_spill", "salu")

# Instruction counts over the final bundles: column -> opcode pattern (opcodes are dotted,
# `vmatpush.bf16.msra.mxu0`; the pattern is matched at the start of the full opcode).
INSTRUCTION_COUNTS = {
    "n_vmatpush": r"vmatpush\b",      # weight pushes into an MXU
    "n_vmatmul": r"vmatmul\b",        # LHS vectors streamed through an MXU
    "n_mxu_pop": r"vpop\..*\bmrf\b",  # results popped from an MXU result FIFO
    "n_vld": r"vld\b",                # vector loads from VMEM (spill fills included)
    "n_vst": r"vst\b",                # vector stores to VMEM (spill stores included)
    "n_dma_start": r"dma\.(?!done)",  # DMAs issued (hbm_to_vmem, vmem_to_hbm, general, ...)
    "n_dma_wait": r"dma\.done",       # waits for a DMA to finish
}
_COUNT_RES = {c: re.compile(p) for c, p in INSTRUCTION_COUNTS.items()}

# One row per LLO program of a `--xla_jf_dump_to` directory; plus, for each slot in SLOTS,
# `cap_<slot>` (int64, units of that slot per bundle, from the capacity line) and `util_<slot>`
# (float64, 0..1: the slot's per-bundle counts summed over all bundles / (bundles x capacity)).
# For MXU the count is MXUs busy in that bundle, not vmatmul issued (fusion.4 of the fixture: 22k
# MXU-bundles for 2k vmatmul), so util_mxu is MXU occupancy.
LLO_PROGRAMS = {
    "module": "object",          # HLO module of the TLP dumped last at or before this program ("" if none)
    "program": "object",         # HLO op name ("fusion.4", "all-reduce"), "TLP", "<late-initialization>", ...
    "kind": "object",            # "op", "tlp" (a module's top-level program) or "late" (<late-...>)
    "dump_id": "int64",          # the number the compiler puts before each file name (increases with time)
    "bundles": "int64",          # VLIW bundles, schedule-analysis "total scheduled bundles"
    "empty_bundles": "int64",    # bundles with no instruction ("empty scheduled bundles")
    "spill_stores": "int64",     # vector stores to spill slots (VSTORE:SPILL summed; -1 if no such slot)
    "spill_loads": "int64",      # vector loads from spill slots (VLOAD:FILL summed; -1 if no such slot)
    "loops": "int64",            # loops in the final bundles (bundles marked LB, the start of a loop body)
    "max_loop_depth": "int64",   # deepest loop nesting (the count of `>` after a bundle's marker)
    "n_instructions": "int64",   # instructions in all bundles, pseudo-ops (scheduling barriers) included
    **{c: "int64" for c in INSTRUCTION_COUNTS},  # instructions per kind, see INSTRUCTION_COUNTS
    "file": "object",            # the final_bundles file name
    **{f"cap_{s}": "int64" for s in SLOTS},
    **{f"util_{s}": "float64" for s in SLOTS},
}

_PROFILE_FILE = re.compile(r"^(.+)_static_llo_profile\.textproto$")
# `<id>-<program>-NN-<label>`: the program name may itself contain '-' (`all-reduce.1`,
# `<late-finalization>`), so the label is matched from the end.
_LABELS = {"final_hlo-static-per-bundle-utilization": "util", "schedule-analysis_final_bundles": "schedule",
           "final_bundles": "bundles"}
_LLO_FILE = re.compile(r"^(\d+)-(.+)-(\d+)-(" + "|".join(map(re.escape, _LABELS)) + r")\.txt$")
_MODULE_FILE = re.compile(r"^(\d+)-TLP-hlo\.txt$")
_BUNDLE = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)\s+([A-Z]{2})?\s*:\s*(>*)\s*\{")
_BUNDLE_END = re.compile(r"\}\s*(/\*.*\*/)?\s*$", re.S)
_OPCODE = re.compile(r"^\s*(?:%[^\s=]+\s*=\s*)?([A-Za-z_][\w.\-]*)")


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise ParseError(path, "not text: expected a text dump of the TPU compiler") from None
    except OSError as e:
        raise ParseError(path, f"cannot read ({e.strerror})") from None


def _dir(path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a directory")
    return path


def _slot_id(name: str) -> str:
    """`VLOAD:FILL` -> `vload_fill`."""
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


# --- text-format protobuf ------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(#.*)|("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|([{}<>\[\]:,;])|([^\s{}<>\[\]:,;"\'#]+))')
_CLOSE = {"{": "}", "<": ">"}


def _tokens(text: str, path: Path) -> list[tuple[str, str, int]]:
    """(kind, text, line) with kind "str", "punct" or "word"."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        i = 0
        while i < len(line):
            m = _TOKEN.match(line, i)
            if not m or m.end() == i:
                if line[i:].strip():
                    raise ParseError(path, "unreadable text-format token (an unterminated string?)", line=n,
                                     snippet=line[i:].strip())
                break
            i = m.end()
            if m.group(2):
                out.append(("str", m.group(2)[1:-1], n))
            elif m.group(3):
                out.append(("punct", m.group(3), n))
            elif m.group(4):
                out.append(("word", m.group(4), n))
    return out


def _parse_textproto(text: str, path: Path) -> list[tuple[str, object, int]]:
    """Text-format protobuf -> [(field, value, line)], a value being a str or such a list.

    Enough of the format for the compiler's dumps: `name: scalar`, `name {...}`, `name: {...}`,
    `<...>` messages and `[a, b]` lists. Unknown fields are kept, not checked.
    """
    toks = _tokens(text, path)
    last = len(text.splitlines())

    def value(i: int, name_line: int):
        if i >= len(toks):
            raise ParseError(path, "truncated: a field has no value", line=name_line)
        kind, tok, line = toks[i]
        if kind == "punct" and tok in _CLOSE:
            return message(i + 1, _CLOSE[tok], line)
        if kind in ("word", "str"):
            return tok, i + 1
        raise ParseError(path, f"expected a value, got {tok!r}", line=line, snippet=tok)

    def message(i: int, close: str | None, open_line: int):
        fields = []
        while i < len(toks):
            kind, tok, line = toks[i]
            if kind == "punct" and tok == close:
                return fields, i + 1
            if kind == "punct" and tok in ",;":  # optional field separators
                i += 1
                continue
            if kind != "word":
                raise ParseError(path, f"expected a field name, got {tok!r}", line=line, snippet=tok)
            i += 1
            colon = i < len(toks) and toks[i][:2] == ("punct", ":")
            i += colon
            if i >= len(toks):
                raise ParseError(path, f"truncated: field {tok!r} has no value", line=last)
            kind, nxt, nline = toks[i]
            if (kind, nxt) == ("punct", "["):
                i += 1
                while i < len(toks) and toks[i][:2] != ("punct", "]"):
                    v, i = value(i, line)
                    fields.append((tok, v, line))
                    if i < len(toks) and toks[i][:2] == ("punct", ","):
                        i += 1
                if i >= len(toks):
                    raise ParseError(path, f"truncated: the list of {tok!r} is not closed", line=last)
                i += 1
            elif (kind == "punct" and nxt in _CLOSE) or (colon and kind != "punct"):
                v, i = value(i, line)
                fields.append((tok, v, line))
            else:  # a scalar needs `name: value`; anything else is not text-format protobuf
                raise ParseError(path, f"expected `{tok}: value` or `{tok} {{...}}`", line=nline, snippet=nxt)
        if close is not None:
            raise ParseError(path, f"truncated: the message opened at line {open_line} is not closed", line=last)
        return fields, i

    fields, _ = message(0, None, 1)
    return fields


def _scalar(fields: list, name: str, path: Path, *, integer: bool = False, default=None):
    for f, v, line in fields:
        if f == name:
            if isinstance(v, list):
                raise ParseError(path, f"{name} should be a scalar, got a message", line=line)
            if integer:
                if not re.fullmatch(r"-?\d+", v):
                    raise ParseError(path, f"{name} should be an integer", line=line, snippet=v)
                return int(v)
            return v
    return default


def read_static_profiles(directory) -> pd.DataFrame:
    """One row per `hlo_op_estimate` in the `*_static_llo_profile.textproto` files of a directory."""
    directory = _dir(directory)
    rows = []
    for path in sorted(directory.iterdir()):
        if not _PROFILE_FILE.match(path.name):
            continue
        text = _read_text(path)
        estimates = [(v, line) for f, v, line in _parse_textproto(text, path) if f == "hlo_op_estimate"]
        if not estimates:
            raise ParseError(path, "no hlo_op_estimate message", line=len(text.splitlines()) or None)
        for msg, line in estimates:
            if not isinstance(msg, list):
                raise ParseError(path, "hlo_op_estimate should be a message", line=line)
            op = _scalar(msg, "hlo_op_name", path)
            cycles = _scalar(msg, "estimated_cycles", path, integer=True)
            if op is None or cycles is None:
                missing = "hlo_op_name" if op is None else "estimated_cycles"
                raise ParseError(path, f"hlo_op_estimate without {missing}", line=line)
            if cycles < 0:
                raise ParseError(path, f"negative estimated_cycles {cycles}", line=line)
            dma = _scalar(msg, "dma_instruction_type", path, default="")
            rows.append({"op": op, "estimated_cycles": cycles,
                         "num_equivalent_hlos": _scalar(msg, "num_equivalent_hlos", path, integer=True, default=0),
                         "dma_instruction_type": dma,
                         "estimate_missing": cycles == 0 and "REMOTE" in dma, "file": path.name})
    df = pd.DataFrame(rows, columns=list(STATIC_PROFILES)) if rows else empty_frame(STATIC_PROFILES)
    df = df.astype(STATIC_PROFILES)
    return check_frame(df, STATIC_PROFILES, "static LLO profile")


# --- LLO text dumps -------------------------------------------------------------------------

def _read_schedule(path: Path) -> tuple[int | None, int | None]:
    """(total, empty) scheduled bundles of a `*-schedule-analysis_final_bundles.txt`; (None, None)
    for the empty analysis v4 writes for its <late-initialization> program (libtpu 0.0.42)."""
    lines = _read_text(path).splitlines()
    if not lines:
        return None, None
    if lines[0].strip() != "Schedule analysis:":
        raise ParseError(path, "expected a `Schedule analysis:` header", line=1,
                         snippet=lines[0] if lines else None)
    found = {}
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*(total|empty) scheduled bundles:\s*(\S+)\s*$", line)
        if m:
            if not m.group(2).isdigit():
                raise ParseError(path, f"{m.group(1)} scheduled bundles should be a count", line=n, snippet=line)
            found[m.group(1)] = int(m.group(2))
    for key in ("total", "empty"):
        if key not in found:
            raise ParseError(path, f"no `{key} scheduled bundles:` line (truncated?)", line=len(lines))
    return found["total"], found["empty"]


def _read_utilization(path: Path, bundles: int | None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(slot ids, capacity per slot, per-slot sums over bundles) of a per-bundle utilization file.

    Layout: `== CAPACTIY:` (sic), a comma-separated line of slot names, a line of capacities,
    `== UTILIZATION:`, then one line of per-slot instruction counts per bundle.
    """
    lines = _read_text(path).splitlines()

    def expect(n: int, pattern: str, what: str) -> re.Match:
        line = lines[n] if n < len(lines) else ""
        m = re.fullmatch(pattern, line.strip())
        if not m:
            raise ParseError(path, f"expected {what}", line=min(n + 1, max(len(lines), 1)), snippet=line or None)
        return m

    expect(0, r"== CAPA(?:CTIY|CITY):", "the `== CAPACTIY:` header")
    names = [s.strip() for s in expect(1, r"[A-Za-z][\w:]*(\s*,\s*[A-Za-z][\w:]*)*", "slot names").group(0).split(",")]
    caps = expect(2, r"\d+(\s+\d+)*", "one capacity per slot").group(0).split()
    if len(caps) != len(names):
        raise ParseError(path, f"{len(names)} slot names but {len(caps)} capacities", line=3, snippet=lines[2])
    expect(3, r"== UTILIZATION:", "the `== UTILIZATION:` header")
    width = len(names)
    sums = np.zeros(width, dtype=np.int64)
    rows = 0
    for n in range(4, len(lines)):
        parts = lines[n].split()
        if not parts:
            continue
        if len(parts) != width or not all(p.isdigit() for p in parts):
            raise ParseError(path, f"expected {width} per-slot counts", line=n + 1, snippet=lines[n])
        sums += np.array(parts, dtype=np.int64)
        rows += 1
    if bundles is not None and rows != bundles:
        raise ParseError(path, f"{rows} bundle rows, but the schedule analysis counts {bundles} bundles (truncated?)",
                         line=len(lines))
    return [_slot_id(s) for s in names], np.array(caps, dtype=np.int64), sums


def _read_bundles(path: Path) -> dict[str, int]:
    """Bundle count, loops, loop depth and instruction counts of a `*-final_bundles.txt`.

    A bundle is `ADDR MARK: DEPTH { instr ;; instr ... } /* comment */`: ADDR its index (hex, `0`
    for the first), MARK a control-target marker from the file's own legend (LH, LB, LE, PB, PF,
    CT) or blank, DEPTH one `>` per enclosing loop. A comment may run over several lines.
    """
    lines = _read_text(path).splitlines()
    records: list[tuple[int, int]] = []  # (first line index, last line index)
    in_key = False
    for n, line in enumerate(lines):
        if _BUNDLE.match(line):
            records.append((n, n))
        elif records:
            if line.strip():
                records[-1] = (records[-1][0], n)  # a comment continued from the bundle above
        elif line.strip() == "= control target key start":
            in_key = True
        elif line.strip() == "= control target key end":
            in_key = False
        elif line.strip() and not in_key:
            raise ParseError(path, "expected a bundle `ADDR : { ... }`", line=n + 1, snippet=line.strip())
    out = {"bundles": len(records), "loops": 0, "max_loop_depth": 0, "n_instructions": 0,
           **{c: 0 for c in INSTRUCTION_COUNTS}}
    for index, (first, last) in enumerate(records):
        m = _BUNDLE.match(lines[first])
        if int(m.group(1), 0) != index:
            raise ParseError(path, f"bundle {m.group(1)} out of sequence (expected {index:#x})", line=first + 1,
                             snippet=lines[first].strip())
        text = "\n".join(lines[first : last + 1])
        if not _BUNDLE_END.search(text):
            raise ParseError(path, "bundle not closed with `}` (truncated?)", line=last + 1, snippet=lines[last].strip())
        out["loops"] += m.group(2) == "LB"
        out["max_loop_depth"] = max(out["max_loop_depth"], len(m.group(3)))
        for piece in text[m.end():].split(";;"):
            op = _OPCODE.match(piece)
            if not op:
                continue  # the empty bundle `{}`
            out["n_instructions"] += 1
            for col, rx in _COUNT_RES.items():
                out[col] += bool(rx.match(op.group(1)))
    return out


def _module_name(path: Path) -> str:
    text = _read_text(path)
    m = re.match(r"\s*HloModule\s+([^\s,]+)", text)
    if not m:
        raise ParseError(path, "expected an `HloModule NAME` header", line=1, snippet=text.split("\n", 1)[0])
    return m.group(1)


def read_llo_dump(directory) -> pd.DataFrame:
    """One row per LLO program in a `--xla_jf_dump_to` directory (see the module docstring)."""
    directory = _dir(directory)
    files: dict[tuple[int, str], dict[str, Path]] = {}
    modules: dict[int, str] = {}
    for path in directory.iterdir():
        m = _LLO_FILE.match(path.name)
        if m:
            files.setdefault((int(m.group(1)), m.group(2)), {})[_LABELS[m.group(4)]] = path
        elif _MODULE_FILE.match(path.name):
            modules[int(_MODULE_FILE.match(path.name).group(1))] = _module_name(path)
    rows = []
    for dump_id, program in sorted(files):
        have = files[(dump_id, program)]
        for label, key in _LABELS.items():
            if key not in have:
                raise InputError(f"{directory}: LLO program {dump_id}-{program} has no `{label}` file; dump with "
                                 "--xla_jf_dump_llo_pass_label_regex=final_bundles|final_hlo-static-per-bundle-utilization")
        bundles, empty = _read_schedule(have["schedule"])
        slots, caps, sums = _read_utilization(have["util"], bundles)
        counted = _read_bundles(have["bundles"])
        if bundles is not None and counted["bundles"] != bundles:
            raise ParseError(have["bundles"], f"{counted['bundles']} bundles, but the schedule analysis counts "
                             f"{bundles} (truncated?)", line=len(_read_text(have["bundles"]).splitlines()))
        # Programs of one module are dumped after its TLP (same or larger id): attribute by order.
        owner = max((i for i in modules if i <= dump_id), default=None)
        row = {"module": modules.get(owner, ""), "program": program,
               "kind": "tlp" if program == "TLP" else "late" if program.startswith("<late-") else "op",
               "dump_id": dump_id, "empty_bundles": -1 if empty is None else empty, **counted, "file": have["bundles"].name}
        by_slot = dict(zip(slots, zip(caps, sums)))
        row["spill_stores"] = int(by_slot["vstore_spill"][1]) if "vstore_spill" in by_slot else -1
        row["spill_loads"] = int(by_slot["vload_fill"][1]) if "vload_fill" in by_slot else -1
        for s in dict.fromkeys([*SLOTS, *slots]):
            cap, total = by_slot.get(s, (0, 0))
            row[f"cap_{s}"] = int(cap)
            row[f"util_{s}"] = total / (bundles * cap) if bundles and cap else float("nan")
        rows.append(row)
    if not rows:
        return empty_frame(LLO_PROGRAMS)
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in LLO_PROGRAMS]
    df = df[list(LLO_PROGRAMS) + extra]
    df = df.astype({c: ("int64" if c.startswith("cap_") else "float64") for c in extra} | LLO_PROGRAMS)
    return check_frame(df, LLO_PROGRAMS, "LLO program")


def read_vmem_report(path) -> dict:
    """The VMEM use the TPU compiler reports for one module (`*-vmem_report.html`).

    The page embeds its data as `const DATA = {...}` JSON; this returns
    `{"module", "vmem_capacity_bytes", "peak_bytes", "peak_op", "ops": {op: {"total_bytes",
    "padding_bytes", "<block type>_bytes"...}}}`. Block types seen: `scoped` (an op's scratch),
    `hlo_temporary` (buffers XLA placed in VMEM); the legend also names spill. The report states no
    peak: `peak_bytes` is its largest entry, which is `<top-inlining-caller>` (the top-level
    program: temporaries plus the scoped block of the op inlined into it) when present.
    """
    path = Path(path)
    text = _read_text(path)
    marker = re.search(r"const\s+DATA\s*=\s*", text)
    if not marker:
        raise ParseError(path, "no `const DATA = {...}` in the report")
    start_line = text.count("\n", 0, marker.end()) + 1
    try:
        data, _ = json.JSONDecoder().raw_decode(text, marker.end())
    except json.JSONDecodeError as e:
        raise ParseError(path, f"the DATA JSON is malformed ({e.msg})", line=e.lineno) from None
    try:
        info, breakdowns = data["global_info"], data["hlo_breakdowns"]
        ops = {}
        for op, entry in breakdowns.items():
            d = {"total_bytes": int(entry["total_size"]), "padding_bytes": 0}
            for block in entry["blocks"]:
                key = f"{_slot_id(block['block_type'])}_bytes"
                d[key] = d.get(key, 0) + int(block["block_size"])
                d["padding_bytes"] += sum(int(a.get("padding", 0)) for a in block["allocations"])
            ops[op] = d
        peak_op = max(ops, key=lambda o: ops[o]["total_bytes"], default="")
        return {"module": str(info["module_name"]), "vmem_capacity_bytes": int(info["vmem_capacity"]),
                "peak_bytes": ops[peak_op]["total_bytes"] if ops else 0, "peak_op": peak_op, "ops": ops}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ParseError(path, f"the DATA JSON lacks an expected field ({e!r})", line=start_line) from None
