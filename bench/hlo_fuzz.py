"""HLO parser fuzzing, for as long as it is given: tests/parse/test_hlo_fuzz.py's loop, longer.

Runs case 0, 1, 2, ... of tests/parse/test_hlo_fuzz.py (a real fixture HLO file with one to three
random mutations; case N is seeded `SEED + N`, so the first 400 are the test's) until `--seconds`
have passed, each parse and each read of the module guarded by the test's time limit. Prints how
many cases ran, the outcomes (a module, a ParseError, or a failure: `crash`, `hang`, `bad-error`,
`accessor`) overall and per mutation, and every distinct failure (kind and exception, with
digits masked) with the first case that showed it. For each distinct failure it shrinks the
input (lines, then characters, for at most `--shrink-seconds`) to a minimal text that still
fails the same way, prints it and, with `--save DIR`, writes it there. Exit status 1 if anything
failed; asserts nothing about time.

    python bench/hlo_fuzz.py [--seconds 60] [--start 0] [--shrink-seconds 20] [--save DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests package lives in the repository root

from tests.parse.test_hlo_fuzz import FUZZ_FILES, OUTCOMES, make_case, run_case  # noqa: E402

FAILURES = ("crash", "hang", "bad-error", "accessor")


def signature(outcome: str, detail: str) -> str:
    """What makes two failures the same: the kind and the exception with numbers and quoted text masked."""
    head = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", detail.split("\n")[0])
    return f"{outcome}: {re.sub(r'[0-9]+', 'N', head)[:90]}"


def shrink(text: str, path: str, sig: str, seconds: float) -> str:
    """A smaller text with the same failure signature: drop runs of lines, then of characters."""
    deadline = time.monotonic() + seconds

    def same(candidate: str) -> bool:
        return signature(*run_case(candidate, path)) == sig

    def reduce(parts: list[str], joiner: str) -> list[str]:
        chunk = max(len(parts) // 2, 1)
        while chunk >= 1 and time.monotonic() < deadline:
            i, progressed = 0, False
            while i < len(parts) and time.monotonic() < deadline:
                trial = parts[:i] + parts[i + chunk:]
                if trial and same(joiner.join(trial)):
                    parts, progressed = trial, True
                else:
                    i += chunk
            if not progressed:
                chunk //= 2
        return parts

    lines = reduce(text.split("\n"), "\n")
    text = "\n".join(lines)
    return "".join(reduce(list(text), ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60, help="how long to run cases")
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--shrink-seconds", type=float, default=20, help="time to shrink each distinct failure")
    ap.add_argument("--save", type=Path, help="write each shrunk failure here")
    args = ap.parse_args()

    texts = {p: p.read_text() for p in FUZZ_FILES}
    print(f"{len(texts)} fixture HLO files, {sum(map(len, texts.values())) / 1e6:.1f} MB; "
          f"running cases from {args.start} for {args.seconds:.0f} s ...")
    outcomes: Counter = Counter()
    by_mutation: dict[str, Counter] = defaultdict(Counter)
    first: dict[str, tuple[int, Path, list[str], str, str]] = {}  # signature -> first case
    per_sig: Counter = Counter()
    n, t0 = args.start, time.monotonic()
    while time.monotonic() - t0 < args.seconds:
        path, text, steps = make_case(n, texts)
        outcome, detail = run_case(text, str(path))
        outcomes[outcome] += 1
        for step in steps:
            by_mutation[step.split(":")[0]][outcome] += 1
        if outcome in FAILURES:
            sig = signature(outcome, detail)
            per_sig[sig] += 1
            first.setdefault(sig, (n, path, steps, text, detail))
        n += 1
    elapsed = time.monotonic() - t0
    ran = n - args.start

    print(f"\n{ran:,} cases in {elapsed:.1f} s ({ran / elapsed:.0f}/s), cases {args.start}..{n - 1}")
    print("outcomes: " + ", ".join(f"{o} {outcomes[o]:,}" for o in OUTCOMES))
    print(f"\n{'mutation':16} " + " ".join(f"{o:>10}" for o in OUTCOMES))
    for name in sorted(by_mutation):
        print(f"{name:16} " + " ".join(f"{by_mutation[name][o]:>10,}" for o in OUTCOMES))

    n_fail = sum(outcomes[o] for o in FAILURES)
    print(f"\nfailures: {n_fail:,} in {len(first)} distinct kinds")
    if args.save and first:
        args.save.mkdir(parents=True, exist_ok=True)
    for k, (sig, (case, path, steps, text, detail)) in enumerate(sorted(first.items())):
        small = shrink(text, str(path), sig, args.shrink_seconds)
        print(f"\n[{k + 1}] {sig}  ({per_sig[sig]:,} cases)")
        print(f"  first: case {case}, {path.relative_to(REPO)}; {'; '.join(steps)}")
        print(f"  detail: {detail[:200]}")
        print(f"  shrunk to {len(small)} chars ({len(text):,} before); {run_case(small, str(path))[1][:200]}")
        print("  " + "\n  ".join(repr(ln) for ln in small.split("\n")))
        if args.save:
            out = args.save / f"failure-{k + 1}.hlo.txt"
            out.write_text(small)
            print(f"  saved {out}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
