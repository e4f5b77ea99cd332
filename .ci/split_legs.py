"""Write tests/legs.txt from pytest's `--durations=0` output: the tests that take at least MIN seconds
(setup and call together), one line each, `seconds test-id`, slowest first. tests/conftest.py runs each
listed test on one of CI's two jax legs, balancing the legs by these seconds.

    pytest -q --durations=0 > durations.log; python .ci/split_legs.py durations.log [more.log ...] [--min 3]
    CI=true PYTEST_ADDOPTS=--durations=0 bash .ci/run > ci.log; python .ci/split_legs.py ci.log --min 0.5

A test's seconds are those of its slowest leg (a CI log holds both, each line prefixed with its leg).

Tests already bound to one leg (the `oldest_leg` / `newest_leg` fixtures, or a skip) are not listed:
a skipped test's duration is under pytest's 0.005 s display floor.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list[str]) -> int:
    minimum = 3.0
    if "--min" in argv:
        i = argv.index("--min")
        minimum = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    missing = [a for a in argv if not Path(a).is_file()]
    if missing:
        print(f"split_legs: {missing[0]}: no such log", file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)  # a test's slowest leg (a log may hold both legs)
    for log in argv:
        per_leg: dict[tuple[str, str], float] = defaultdict(float)
        for line in Path(log).read_text(errors="replace").splitlines():
            m = re.match(r"\s*(?:\[(\w+)\] )?([\d.]+)s (setup|call|teardown)\s+(\S+)", line)
            if m:
                per_leg[m.group(1) or log, m.group(4)] += float(m.group(2))
        for (_, test), s in per_leg.items():
            seconds[test] = max(seconds[test], s)
    rows = sorted(((s, t) for t, s in seconds.items() if s >= minimum), key=lambda r: (-r[0], r[1]))
    out = Path(__file__).resolve().parents[1] / "tests" / "legs.txt"
    out.write_text("# seconds test-id: run on one CI leg each (tests/conftest.py); written by .ci/split_legs.py\n"
                   + "".join(f"{s:.1f} {t}\n" for s, t in rows))
    print(f"{out}: {len(rows)} tests, {sum(s for s, _ in rows):.0f} s, about {sum(s for s, _ in rows) / 2:.0f} s "
          "saved per leg", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
