"""HLO files from outside this repository: tpudiag's HLO parser against XLA's own, instruction by instruction.

Reads each HLO text file named on the command line (for example the CPU benchmark models under
`xla/backends/cpu/benchmarks/hlo/` in openxla/xla, which tpudiag's fixtures did not produce) with
- tpudiag: `tpudiag.parse.hlo.read_hlo_file(path)`;
- XLA: `jaxlib._hlo.hlo_module_from_text(text)` (the parser `jax` itself uses),
and compares, for every instruction, its name, its opcode (XLA's enum turned into its text
spelling) and the names of its operands, plus the computation it sits in. Async syntax sugar
(`slice-start`/`slice-done`, which XLA's parser turns into async-start/async-done plus a wrapper
computation that the text does not have) is counted and shown apart, not as a disagreement. Prints the counts, up
to `--show` mismatches of each kind, and the parse times of both (best of `--repeat`, each parser
given the text already in memory, so file reading is not timed). Exits 1 if any file disagrees or
fails to parse, else 0; asserts nothing about time.

    python bench/hlo_external.py [--repeat 5] [--show 10] PATH...
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from jaxlib import _hlo

from tpudiag.errors import ParseError
from tpudiag.parse.hlo import parse_hlo_text, read_hlo_file

# Opcodes whose text spelling (HloOpcodeString in XLA) is not the kebab-case of the enum name.
# Each was checked against XLA's parser in jaxlib 0.10.2 (text in, enum out). This is a superset of
# the table in tests/parse/test_hlo.py: kCos, kSin, kClz and kTopK are added here.
_SPELLING = {"log1p": "log-plus-one", "expm1": "exponential-minus-one", "exp": "exponential",
             "optimization-barrier": "opt-barrier", "population-count": "popcnt", "cos": "cosine",
             "sin": "sine", "clz": "count-leading-zeros", "top-k": "topk"}


def xla_opcode(enum) -> str:
    """HloOpcode.kGetTupleElement -> get-tuple-element (XLA's text spelling)."""
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", enum.name[1:]).lower()
    return _SPELLING.get(kebab, kebab)


def best_time(fn, repeat: int) -> tuple[float, list[float]]:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return min(runs), runs


def compare(path: Path, repeat: int, show: int) -> bool:
    text = path.read_text()
    print(f"{path}  ({len(text):,} chars, {text.count(chr(10)):,} lines)")
    try:
        mine = read_hlo_file(path)
    except ParseError as e:
        print(f"  tpudiag: ParseError: {e}")
        return False
    try:
        xla = _hlo.hlo_module_from_text(text)
    except Exception as e:  # XLA raises a plain XlaRuntimeError/ValueError on bad text
        print(f"  XLA: {type(e).__name__}: {str(e)[:300]}")
        return False

    oracle: dict[str, tuple[str, str, list[str]]] = {}
    async_ops = []  # (name, the `X-start`/`X-done` spelling, the wrapped root's name)
    for comp in xla.computations():
        for i in comp.instructions():
            op = xla_opcode(i.opcode)
            oracle[i.name] = (comp.name, op, [o.name for o in i.operands()])
            if op in ("async-start", "async-update", "async-done"):
                root = i.async_wrapped_root()
                async_ops.append((i.name, f"{xla_opcode(root.opcode)}-{op[len('async-'):]}", root.name))
    ours = {i.name: (i.computation, i.opcode, i.operands) for i in mine.instructions()}
    n_ours_rows = sum(len(c.instructions) for c in mine.computations.values())

    # Async syntax sugar: the text `%s = ... slice-start(%p), slice={...}` / `slice-done(%s)` is
    # XLA's short form of async-start/async-done calling a one-instruction wrapper computation.
    # XLA's parser builds that wrapper (`async_wrapped.N`: `async_param.N` + the op); the text has
    # none, and tpudiag keeps the opcode as written. Counted apart, not as disagreement.
    sugared = {n for n, spelled, _ in async_ops if n in ours and ours[n][1] == spelled}
    wrappers = {oracle[root][0] for n, _, root in async_ops if n in sugared} - set(mine.computations)
    in_wrappers = {n for n, v in oracle.items() if v[0] in wrappers}

    missing = sorted(set(oracle) - set(ours) - in_wrappers)
    extra = sorted(set(ours) - set(oracle))
    both = [n for n in oracle if n in ours]
    keys = ("computation", "opcode", "operands")
    bad = {k: [n for n in both if oracle[n][j] != ours[n][j] and not (k == "opcode" and n in sugared)]
           for j, k in enumerate(keys)}

    print(f"  computations: XLA {len(list(xla.computations()))}, tpudiag {len(mine.computations)}")
    print(f"  instructions: XLA {len(oracle):,}, tpudiag {len(ours):,} (rows {n_ours_rows:,}), in both {len(both):,}")
    if sugared:
        spellings = sorted({spelled for n, spelled, _ in async_ops if n in sugared})
        print(f"  async syntax sugar: {len(sugared)} instructions written {'/'.join(spellings)}; XLA's parser "
              f"reads them as async-start/-done and adds {len(wrappers)} wrapper computations "
              f"({len(in_wrappers)} instructions) that are not in the text (counted apart)")
    print(f"  only in XLA: {len(missing)}  only in tpudiag: {len(extra)}  "
          + "  ".join(f"{k} differs: {len(v)}" for k, v in bad.items()))
    for n in missing[:show]:
        print(f"    only in XLA: {n} = {oracle[n][1]}{tuple(oracle[n][2])}")
    for n in extra[:show]:
        print(f"    only in tpudiag: {n} = {ours[n][1]}{tuple(ours[n][2])}")
    for j, (k, names) in enumerate(bad.items()):
        for n in names[:show]:
            print(f"    {k} of {n}: XLA {oracle[n][j]!r}  tpudiag {ours[n][j]!r}")

    t_ours, runs_ours = best_time(lambda: parse_hlo_text(text, str(path)), repeat)
    t_xla, runs_xla = best_time(lambda: _hlo.hlo_module_from_text(text), repeat)
    print(f"  parse time, best of {repeat}: tpudiag {t_ours * 1e3:.1f} ms, XLA {t_xla * 1e3:.1f} ms, "
          f"ratio {t_ours / t_xla:.2f}x")
    print(f"    all runs (ms): tpudiag {', '.join(f'{r * 1e3:.1f}' for r in runs_ours)}; "
          f"XLA {', '.join(f'{r * 1e3:.1f}' for r in runs_xla)}")
    agree = not missing and not extra and n_ours_rows == len(ours) and not any(bad.values())
    print(f"  {'AGREE' if agree else 'DISAGREE'}")
    return agree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=5, help="timed parses per parser (best is reported)")
    ap.add_argument("--show", type=int, default=10, help="mismatches listed per kind")
    args = ap.parse_args()
    results = [compare(p, args.repeat, args.show) for p in args.paths]
    print(f"\n{sum(results)} of {len(results)} files agree with XLA's parser")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
