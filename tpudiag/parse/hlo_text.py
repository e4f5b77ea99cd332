"""The small readers under the HLO parser: brackets, quotes and top-level commas of HLO text, and
the values of instruction attributes (`window=`, `slice=`, `replica_groups=`, key=value lists).

Reads strings; returns plain values and two small frozen records (`WindowDim`, `ReplicaGroups`).
Used by `parse.hlo` (the text parser) and `parse.hlo_model` (the typed instruction fields). It
does not read files or build the module model, and never raises on an odd attribute value: what it
cannot read it leaves as text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

KV = re.compile(r"(\w+)=(\"(?:[^\"\\]|\\.)*\"|[^\s}]+)")

_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.S)
_NAMED = {"n": b"\n", "t": b"\t", "r": b"\r"}


def unescape(text: str) -> str:
    """Undo XLA's C escaping of strings (absl::CEscape): `\\'` and `\\"` and `\\\\` in metadata
    (`params[\\'b1\\']`), and the octal bytes of a non-ASCII path (`caf\\303\\251/x.py` is `café/x.py`)."""
    if "\\" not in text:
        return text

    def byte(m: re.Match) -> bytes:
        octal, hexa, char = m.groups()
        if octal is not None:
            return bytes([int(octal, 8) & 0xFF])
        if hexa is not None:
            return bytes([int(hexa, 16)])
        return _NAMED.get(char, char.encode())

    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(text):
        out += text[pos:m.start()].encode() + byte(m)
        pos = m.end()
    out += text[pos:].encode()
    return out.decode("utf-8", errors="backslashreplace")


def ascii_int(text, default: int | None = 0) -> int | None:
    """An ASCII decimal number, else `default` (`str.isdigit` also accepts '²', which int() rejects)."""
    text = (text or "").strip()
    return int(text) if re.fullmatch(r"[0-9]+", text) else default


def balanced(text: str, start: int, open_: str, close: str) -> str:
    """The substring from text[start] (an opening bracket) to its matching close, quotes respected."""
    depth, i, in_str = 0, start, False
    while i < len(text):
        ch = text[i]
        if in_str:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise ValueError(f"unbalanced {open_}{close}")


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets or double quotes (escapes respected)."""
    parts, depth, start, quoted, i = [], 0, 0, False, 0
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if text[start:].strip():
        parts.append(text[start:])
    return parts



# -- attributes -------------------------------------------------------------------------------------

# XLA prints metadata and backend_config after every other attribute
# (HloInstruction::PrintWithCanonicalNameMap); a TPU backend_config runs to 1,000 characters. The
# attributes before the first of these are split on top-level commas; these are read one by one.
# A tail key starts the text or follows a comma: `frontend_attributes={kernel_metadata={}}` (Pallas
# kernels on TPU) holds no metadata.
TAIL_START = re.compile(r"(?:^|,\s*)(?=metadata=\{|backend_config=|original_value=|statistics=)")
TAIL_ITEM = re.compile(r"[\s,]*([\w\-.]+)=")
_FLAT_BRACES = re.compile(r'\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')  # `{...}` with no nested braces
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_BARE = re.compile(r"[^\s,]*")
_JSON = json.JSONDecoder()
# The keys that name computations an instruction runs, in the order `Instruction.called` lists
# them (a conditional's branch i is operand i + 1).
CALL_KEYS = ("calls", "to_apply", "body", "condition", "branch_computations", "true_computation",
              "false_computation")
_INTS = re.compile(r"-?[0-9]+")
SLICE_DIM = re.compile(r"\[\s*(-?[0-9]+)\s*:\s*(-?[0-9]+)\s*(?::\s*(-?[0-9]+)\s*)?\]")
_IOTA_GROUPS = re.compile(r"^\[([0-9,\s]+)\]<=\[([0-9,\s]+)\](?:T\(([0-9,\s]+)\))?$")
_MESH = re.compile(r"^mesh\[([^\]]*)\]\s*(?:\{([^}]*)\})?")
_MESH_AXIS = re.compile(r"'([^']*)'\s*=\s*([0-9]+)")
_AXIS_REF = re.compile(r"'([^']*)'(?::\(([0-9]+)\)([0-9]+))?")


def split_attrs(text: str) -> list[tuple[str, str]]:
    """`a=1, b={x, y}, c="s, t"` -> [(a, 1), (b, {x, y}), (c, "s, t")]: commas inside brackets or
    quotes do not split; an item without `=` is dropped."""
    items = text.split(",") if not any(c in text for c in '([{"') else split_top_level(text)
    if items and not items[-1].strip():
        items.pop()  # split_top_level drops a blank last item; str.split keeps it
    pairs = []
    for item in items:
        key, eq, value = item.strip().partition("=")
        if eq:
            pairs.append((key.strip(), value.strip()))
    return pairs


def tail_value(text: str, start: int, key: str) -> int:
    """End of the attribute value that starts at text[start]: a `{...}` (JSON for backend_config),
    a quoted string, or a bare token; the rest of the text where it does not close."""
    ch = text[start:start + 1]
    if ch == "{":
        m = _FLAT_BRACES.match(text, start)
        if m:
            return m.end()
        if key == "backend_config":
            try:
                return _JSON.raw_decode(text, start)[1]
            except ValueError:
                pass
        try:
            return start + len(balanced(text, start, "{", "}"))
        except ValueError:
            return len(text)
    if ch == '"':
        m = _QUOTED.match(text, start)
        return m.end() if m else len(text)
    return _BARE.match(text, start).end()


def parse_ints(text: str | None) -> tuple[int, ...] | None:
    """`{1,0}` -> (1, 0); None when the attribute is absent."""
    return None if text is None else tuple(int(x) for x in _INTS.findall(text))


def unquote(text: str | None) -> str | None:
    if text is None:
        return None
    return unescape(text[1:-1]) if len(text) >= 2 and text[0] == text[-1] == '"' else text


@dataclass(frozen=True)
class WindowDim:
    """One dimension of `window={size=3x3 stride=2x2 pad=1_1x0_0 lhs_dilate=1x1 rhs_dilate=1x1}`."""

    size: int = 1
    stride: int = 1
    pad_lo: int = 0
    pad_hi: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1


@dataclass(frozen=True)
class ReplicaGroups:
    """A collective's `replica_groups=`, in any of the three spellings XLA prints:
    the list `{{0,1},{2,3}}`, the iota form `[2,4]<=[8]` (optionally `T(1,0)`: 2 groups of 4 from
    iota(8) reshaped and transposed), and the mesh form `mesh['x'=4,'y'=2] {'x'}` (jax 0.12's XLA:
    the groups are formed along the listed axes).

    `groups`: the device ids of each group where the text says them (list and iota forms), else
    None. `group_size`: devices per group (None for an empty list: every device is one group).
    `mesh`: the (axis, size) pairs of the mesh form; `axes`: the axes listed after it."""

    text: str
    groups: tuple[tuple[int, ...], ...] | None
    group_size: int | None
    mesh: tuple[tuple[str, int], ...] = ()
    axes: tuple[str, ...] = ()


def _iota_groups(shape: tuple[int, ...], dims: tuple[int, ...], perm: tuple[int, ...] | None):
    """XLA's IotaReplicaGroupList: iota(prod(dims)) reshaped to `dims`, transposed by `perm`, then
    reshaped to `shape` ([groups, group size])."""
    n = math.prod(dims)
    perm = perm or tuple(range(len(dims)))
    if len(shape) != 2 or math.prod(shape) != n or sorted(perm) != list(range(len(dims))):
        return None
    strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
    tdims = [dims[p] for p in perm]
    flat = []
    for i in range(n):  # row-major index into the transposed array -> element of iota
        rem, src = i, 0
        for k in range(len(tdims) - 1, -1, -1):
            rem, coord = divmod(rem, tdims[k])
            src += coord * strides[perm[k]]
        flat.append(src)
    return tuple(tuple(flat[g * shape[1]:(g + 1) * shape[1]]) for g in range(shape[0]))


def parse_replica_groups(text: str) -> ReplicaGroups:
    """`ReplicaGroups` from the text after `replica_groups=` (never raises: what cannot be read is
    kept as text with `group_size` None)."""
    text = text.strip()
    if text.startswith("{"):
        groups = tuple(tuple(int(x) for x in _INTS.findall(g)) for g in re.findall(r"\{([^{}]*)\}", text[1:-1]))
        return ReplicaGroups(text, groups, max(1, len(groups[0])) if groups else None)
    m = _IOTA_GROUPS.match(text)
    if m:
        shape, dims = parse_ints(m.group(1)), parse_ints(m.group(2))
        perm = parse_ints(m.group(3)) if m.group(3) else None
        return ReplicaGroups(text, _iota_groups(shape, dims, perm), shape[1] if len(shape) == 2 else None)
    m = _MESH.match(text)
    if m:
        mesh = tuple((a, int(n)) for a, n in _MESH_AXIS.findall(m.group(1)))
        sizes = dict(mesh)
        axes, size = [], 1
        for name, _pre, sub in _AXIS_REF.findall(m.group(2) or ""):
            axes.append(name)  # `'x':(1)2`: a sub-axis of size 2
            size *= int(sub) if sub else sizes.get(name, 0)
        if not axes or not size:  # no axes listed (or unknown ones): the whole mesh
            size = math.prod(sizes.values()) if sizes else 0
        return ReplicaGroups(text, None, size or None, mesh, tuple(axes))
    return ReplicaGroups(text, None, None)

