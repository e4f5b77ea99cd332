"""The HLO module model: `HloModule` -> `Computation` -> `Instruction`, as `parse.hlo` builds it.

An instruction keeps its attribute text as printed (`attrs`); its typed fields (`called`,
`dimensions`, `window`, `replica_groups`, `backend_config`, `metadata`, ...) are each parsed from
that text on first use and cached, so parsing a module costs no more than reading its lines. The
module builds its def-use graph (`uses`, `users_of`, `instruction`, `operand`), its call graph
(`callers`, `fusion_callers`, `fused_computations`, `walk` over called computations) and the computations that execute
(`executed_computations`) on first use and caches them: a parsed module is read-only.

It does not read text files (that is `parse.hlo`) and computes no costs (that is `analyze/`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from tpudiag.parse.hlo_text import (CALL_KEYS, KV, SLICE_DIM, TAIL_ITEM, TAIL_START, ReplicaGroups, WindowDim,
                                    ascii_int, parse_ints, parse_replica_groups, split_attrs, tail_value, unescape,
                                    unquote)


# Packages whose frames are not the model's own: a source line inside them (flax.linen's attention,
# optax's losses) is reported after the model file's line that called them.
FRAMEWORKS = frozenset({"jax", "jaxlib", "flax", "optax", "numpy", "haiku", "equinox", "chex", "einops", "keras",
                        "torch", "scipy", "ml_dtypes", "orbax", "tpudiag", "runpy", "<frozen runpy>"})


def is_framework_file(path: str) -> bool:
    """A file of an installed framework (`.../site-packages/flax/linen/attention.py`), or Python's
    own machinery that runs a script."""
    if path in FRAMEWORKS or path.startswith("<frozen"):
        return True
    parts = path.replace("\\", "/").split("/")
    for k, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages") and parts[k + 1].split(".")[0] in FRAMEWORKS:
            return True
    return "/tpudiag/capture/" in path  # the run's own driver (child.py)


@dataclass
class Instruction:
    """One HLO instruction. The attribute text (`attrs`) is kept as printed; the typed fields below
    are each parsed from it on first use and cached (parsing stays as fast as reading the text).
    A field is None (or empty) where the attribute is absent."""

    name: str
    opcode: str
    shape: str
    operands: list[str]
    computation: str
    attrs: str  # the text after the operand list (attributes, metadata, backend_config)
    is_root: bool = False
    line: int = 0  # 1-based line in the file
    literal: str = ""  # the parenthesised text of parameter(N), constant(...), iota()

    @property
    def parameter_number(self) -> int | None:
        return ascii_int(self.literal, None) if self.opcode == "parameter" else None

    @cached_property
    def parsed_shape(self):
        """The instruction's shape as a `parse.shapes.Shape`, parsed once."""
        from tpudiag.parse.shapes import parse_shape

        return parse_shape(self.shape)

    @cached_property
    def attributes(self) -> dict[str, str]:
        """Every attribute as printed, by name: `{"dimensions": "{1,0}", "calls": "%fused.3",
        "metadata": "{op_name=...}", "backend_config": "{...}"}`."""
        a = self.attrs
        m = TAIL_START.search(a)
        end = m.start() if m else len(a)
        out = dict(split_attrs(a[:end])) if end else {}
        pos = end
        while pos < len(a):
            m = TAIL_ITEM.match(a, pos)
            if not m:
                break
            stop = tail_value(a, m.end(), m.group(1))
            out[m.group(1)] = a[m.end():stop]
            pos = max(stop, m.end() + 1)
        return out

    def _computations(self, key: str) -> tuple[str, ...]:
        text = self.attributes.get(key)
        if text is None:
            return ()
        return tuple(c.strip().lstrip("%") for c in text.strip("{}").split(",") if c.strip())

    def _computation(self, key: str) -> str | None:
        names = self._computations(key)
        return names[0] if names else None

    @cached_property
    def calls(self) -> str | None:
        """The computation a fusion, async-start or call runs (`calls=%fused_computation.3`)."""
        return self._computation("calls")

    @cached_property
    def to_apply(self) -> str | None:
        """The computation a reduce, map, sort, scatter or all-reduce applies (a reducer)."""
        return self._computation("to_apply")

    @cached_property
    def body(self) -> str | None:
        """A while loop's body."""
        return self._computation("body")

    @cached_property
    def condition(self) -> str | None:
        """A while loop's condition."""
        return self._computation("condition")

    @cached_property
    def branch_computations(self) -> tuple[str, ...]:
        """A conditional's branches, branch i bound to operand i + 1 (the `true_computation`,
        `false_computation` spelling gives (true, false), as XLA's parser builds it)."""
        return (self._computations("branch_computations")
                + self._computations("true_computation") + self._computations("false_computation"))

    @cached_property
    def select(self) -> str | None:
        """select-and-scatter's selecting computation."""
        return self._computation("select")

    @cached_property
    def scatter(self) -> str | None:
        """select-and-scatter's scattering computation."""
        return self._computation("scatter")

    @cached_property
    def called(self) -> list[str]:
        """Computations this instruction calls (fusion `calls=`, `to_apply=`, while `body=`...),
        in `CALL_KEYS` order."""
        return [c for key in CALL_KEYS for c in self._computations(key)]

    @cached_property
    def dimensions(self) -> tuple[int, ...] | None:
        """`dimensions={1,0}`: a transpose's permutation, a reduce's or broadcast's dims."""
        return parse_ints(self.attributes.get("dimensions"))

    @cached_property
    def lhs_contracting_dims(self) -> tuple[int, ...] | None:
        return parse_ints(self.attributes.get("lhs_contracting_dims"))

    @cached_property
    def fft_length(self) -> tuple[int, ...] | None:
        return parse_ints(self.attributes.get("fft_length"))

    @cached_property
    def feature_group_count(self) -> int:
        return ascii_int(self.attributes.get("feature_group_count"), 1)

    @cached_property
    def batch_group_count(self) -> int:
        return ascii_int(self.attributes.get("batch_group_count"), 1)

    @cached_property
    def slice(self) -> tuple[tuple[int, int, int], ...] | None:
        """`slice={[0:8], [2:10:2]}` -> ((0, 8, 1), (2, 10, 2)): (start, limit, stride) per dim."""
        text = self.attributes.get("slice")
        if text is None:
            return None
        return tuple((int(a), int(b), int(c) if c else 1) for a, b, c in SLICE_DIM.findall(text))

    @cached_property
    def window(self) -> tuple[WindowDim, ...]:
        """`window={size=3x3 stride=2x2 pad=1_1x0_0 lhs_dilate=1x1 rhs_dilate=1x1}` -> one
        `WindowDim` per dim; () when there is no window."""
        text = self.attributes.get("window")
        if not text:
            return ()
        fields: dict[str, list[str]] = {}
        for item in text.strip("{}").split():
            key, _, val = item.partition("=")
            fields[key] = val.split("x")
        out = []
        for d in range(len(fields.get("size", []))):
            def get(key: str, default: int) -> int:
                vals = fields.get(key)
                return int(vals[d]) if vals else default
            lo, hi = (fields["pad"][d].split("_") if "pad" in fields else ("0", "0"))
            out.append(WindowDim(get("size", 1), get("stride", 1), int(lo), int(hi), get("lhs_dilate", 1),
                                 get("rhs_dilate", 1)))
        return tuple(out)

    @cached_property
    def dim_labels(self) -> tuple[str, str, str] | None:
        """A convolution's `dim_labels=bf01_oi01->bf01` -> ("bf01", "oi01", "bf01") (lhs, kernel, output)."""
        m = re.fullmatch(r"(\w+)_(\w+)->(\w+)", self.attributes.get("dim_labels", ""))
        return (m.group(1), m.group(2), m.group(3)) if m else None

    @cached_property
    def replica_groups(self) -> ReplicaGroups | None:
        text = self.attributes.get("replica_groups")
        return None if text is None else parse_replica_groups(text)

    @cached_property
    def is_host_transfer(self) -> bool:
        """send/recv to or from the host (`is_host_transfer=true`)."""
        return self.attributes.get("is_host_transfer") == "true"

    @cached_property
    def backend_config(self) -> dict | None:
        """The backend config as JSON (`backend_config={...}`, or the escaped string
        `backend_config="{...}"` of older dumps); None where absent, not JSON, or not an object."""
        text = self.attributes.get("backend_config")
        if not text:
            return None
        try:
            value = json.loads(unquote(text) if text.startswith('"') else text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    @cached_property
    def known_trip_count(self) -> int | None:
        """A while loop's trip count where XLA recorded it (`"known_trip_count":{"n":"4"}` in the
        backend config; CPU compiles of a fori_loop write it, libtpu 0.0.42's did not)."""
        if self.opcode != "while" or self.backend_config is None:
            return None
        n = self.backend_config.get("known_trip_count")
        n = n.get("n") if isinstance(n, dict) else None
        return ascii_int(str(n), None) if n is not None else None

    @cached_property
    def index(self) -> int | None:
        """The element a get-tuple-element takes (`index=2`)."""
        return ascii_int(self.attributes.get("index"), None) if self.opcode == "get-tuple-element" else None

    @cached_property
    def fusion_kind(self) -> str | None:
        kind = self.attributes.get("kind", "")
        return kind if re.fullmatch(r"k\w+", kind) else None

    @cached_property
    def metadata(self) -> dict[str, str]:
        text = self.attributes.get("metadata")
        if not text:
            return {}
        return {k: unescape(v[1:-1]) if v.startswith('"') else v for k, v in KV.findall(text[1:-1])}

    @cached_property
    def custom_call_target(self) -> str | None:
        return unquote(self.attributes.get("custom_call_target"))


class Use(NamedTuple):
    """One operand slot that reads an instruction: `user.operands[position]`."""

    user: Instruction
    position: int


@dataclass
class Computation:
    name: str
    is_entry: bool
    instructions: list[Instruction] = field(default_factory=list)
    execution_thread: str | None = None  # "sparsecore" for v6e SparseCore offload; None: the main thread

    @cached_property
    def root(self) -> Instruction | None:
        """The ROOT instruction (the last one where none is marked); None for an empty computation."""
        return next((i for i in self.instructions if i.is_root), self.instructions[-1] if self.instructions else None)

    @cached_property
    def parameters(self) -> list[Instruction]:
        """The parameters in parameter-number order (`parameter(N)`)."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda p: (p.parameter_number is None, p.parameter_number or 0))

    def parameter(self, number: int) -> Instruction | None:
        """`parameter(number)`, or None."""
        return next((i for i in self.instructions if i.opcode == "parameter" and i.parameter_number == number), None)


# Instructions whose called computations run as a sequence of ops of their own (bodies, branches).
# Reducers (`to_apply` of reduce, all-reduce, sort, scatter) and fusion bodies run inside their caller.
RUNS_CALLEES = frozenset({"while", "conditional", "call", "async-start"})
# Levels of calls `HloModule.walk` opens below the computations it starts from: fusions nest two or
# three deep in TPU modules (output fusions wrap `bitcast_fusion`s); HLO has no recursion.
WALK_DEPTH = 8


@dataclass
class HloModule:
    """A parsed module. The def-use graph and the call graph are built on first use and cached:
    the module is read-only once parsed.

    Names are unique in a module that XLA printed; hand-written HLO may reuse a name in another
    computation, so lookups and users are kept per computation, keyed (computation, name)."""

    name: str
    path: str
    computations: dict[str, Computation]
    file_names: dict[int, str]
    function_names: dict[int, str]
    file_locations: dict[int, dict[str, str]]
    stack_frames: dict[int, dict[str, str]]

    def instructions(self):
        for comp in self.computations.values():
            yield from comp.instructions

    @property
    def entry(self) -> Computation | None:
        return next((c for c in self.computations.values() if c.is_entry), None)

    # -- def-use graph ----------------------------------------------------------------------------

    @cached_property
    def _by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions()}  # a reused name: the last definition

    @cached_property
    def _by_scoped_name(self) -> dict[tuple[str, str], Instruction]:
        return {(i.computation, i.name): i for i in self.instructions()}

    def instruction(self, name: str, computation: str | None = None) -> Instruction | None:
        """The instruction `name` of `computation` (of the module when None); None if undefined."""
        if computation is None:
            return self._by_name.get(name)
        return self._by_scoped_name.get((computation, name))

    def operand(self, instr: Instruction, k: int) -> Instruction | None:
        """Operand `k` of `instr`, resolved in its own computation; None if absent or undefined."""
        return self.instruction(instr.operands[k], instr.computation) if 0 <= k < len(instr.operands) else None

    @cached_property
    def uses(self) -> dict[tuple[str, str], list[Use]]:
        """(computation, name) -> every operand slot that reads it, in program order (an
        instruction reading it twice appears twice)."""
        out: dict[tuple[str, str], list[Use]] = {}
        for instr in self.instructions():
            for pos, o in enumerate(instr.operands):
                out.setdefault((instr.computation, o), []).append(Use(instr, pos))
        return out

    def uses_of(self, instr: Instruction) -> list[Use]:
        return self.uses.get((instr.computation, instr.name), [])

    def users_of(self, instr: Instruction) -> list[Instruction]:
        """The instructions that read `instr`, each once, in program order (XLA's `users()`)."""
        return list({id(u.user): u.user for u in self.uses_of(instr)}.values())

    # -- call graph -------------------------------------------------------------------------------

    @cached_property
    def callers(self) -> dict[str, list[tuple[Instruction, str]]]:
        """computation -> (calling instruction, the attribute that names it: "calls", "to_apply",
        "body", "condition", "branch_computations", ...), in program order."""
        out: dict[str, list[tuple[Instruction, str]]] = {}
        for instr in self.instructions():
            if not instr.attrs:
                continue
            for key in CALL_KEYS:
                for c in instr._computations(key):
                    out.setdefault(c, []).append((instr, key))
        return out

    @cached_property
    def fusion_callers(self) -> dict[str, Instruction]:
        """fused computation -> the fusion instruction that calls it (the last one, if several)."""
        return {i.called[0]: i for i in self.instructions() if i.opcode == "fusion" and i.called}

    @cached_property
    def _fused(self) -> frozenset[str]:
        return frozenset(c for i in self.instructions() if i.opcode == "fusion" for c in i.called)

    def fused_computations(self) -> set[str]:
        """Names of computations that are the body of some fusion instruction."""
        return set(self._fused)

    def walk(self, computations: Iterable[str], into: Collection[str] | None = None,
             depth: int = WALK_DEPTH) -> Iterator[Instruction]:
        """The instructions of `computations` and of what they call, depth first in text order:
        each instruction is followed by the instructions of the computations it calls (a fusion's
        body, an async-start's wrapped op), before its next sibling.

        `into`: the opcodes whose called computations are opened (None: every caller, reducers
        included); `depth`: how many levels of calls below `computations` are opened. Each
        computation is visited once; a name the module does not define is skipped."""
        seen: set[str] = set()

        def visit(names: Iterable[str], level: int) -> Iterator[Instruction]:
            for name in names:
                comp = self.computations.get(name)
                if comp is None or name in seen:
                    continue
                seen.add(name)
                for instr in comp.instructions:
                    yield instr
                    if level < depth and instr.called and (into is None or instr.opcode in into):
                        yield from visit(instr.called, level + 1)

        return visit(computations, 0)

    @cached_property
    def executed_computations(self) -> tuple[str, ...]:
        """The entry computation and every while body/condition, branch, call and async target
        reachable from it (not fusion bodies, not reducers), breadth-first from the entry.

        Their instructions are what the device executes as units; v6e SparseCore computations
        (`execution_thread="sparsecore"`) run beside the TensorCore and are left out, as XLA's own
        non-fusion computation list (main thread) leaves them out."""
        entry = self.entry
        if entry is None:
            return ()
        order, todo = [], [entry.name]
        while todo:
            name = todo.pop(0)
            if name in order or name not in self.computations:
                continue
            if self.computations[name].execution_thread not in (None, "main"):
                continue
            order.append(name)
            for instr in self.computations[name].instructions:
                if instr.opcode in RUNS_CALLEES:
                    todo += instr.called
        return tuple(order)

    # -- source locations -------------------------------------------------------------------------

    def source_frames(self, instr: Instruction) -> list[tuple[str, int, str]]:
        """The Python call stack (file, line, function) an instruction came from, innermost first."""
        md = instr.metadata
        if "source_file" in md:
            return [(md["source_file"], ascii_int(md.get("source_line")), "")]
        fid = ascii_int(md.get("stack_frame_id"), None)
        out, seen = [], set()
        while fid and fid in self.stack_frames and fid not in seen:
            seen.add(fid)
            frame = self.stack_frames[fid]
            loc = self.file_locations.get(ascii_int(frame.get("file_location_id")), {})
            file = self.file_names.get(ascii_int(loc.get("file_name_id")), "?")
            func = self.function_names.get(ascii_int(loc.get("function_name_id")), "")
            out.append((file, ascii_int(loc.get("line")), func))
            # The dump prints a frame's parent one above its row number (the outermost frame's
            # parent is printed 1): the chain of decoder.py's attention reads attention <- _block
            # <- loss_fn <- train_step <- main, each line inside the function it names.
            fid = ascii_int(frame.get("parent_frame_id"), 0) - 1
        return out

    def call_site(self, instr: Instruction) -> tuple[str | None, str | None]:
        """(`file:line` of the innermost frame outside the frameworks in `FRAMEWORKS`, the innermost
        frame where that is a framework's): the model code's own line (a transformers or MaxText
        model file counts as model code), and the library line that emitted the op."""
        frames = self.source_frames(instr)
        if not frames:
            return None, None
        inner = f"{frames[0][0]}:{frames[0][1]}"
        for file, line, _ in frames:
            if not is_framework_file(file):
                own = f"{file}:{line}"
                return own, (inner if own != inner else None)
        return inner, None

    def source(self, instr: Instruction) -> str | None:
        """`file:line` of the innermost Python frame an instruction came from, if the metadata says."""
        frames = self.source_frames(instr)
        return f"{frames[0][0]}:{frames[0][1]}" if frames else None

