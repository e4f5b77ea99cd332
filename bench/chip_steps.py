"""Time `fixtures/programs/llama_train.py` steps on an attached TPU with tpudiag's own measured check
(`api/measured_step.measure_step`: the step timer in a worker that holds the chip alone, 2 warm-up
calls, then CALLS timed calls, each until its outputs are ready), one configuration at a time.

    python bench/chip_steps.py CONFIGS.txt OUT_DIR [--calls 6] [--only NAME,NAME]

CONFIGS.txt: one configuration a line, `NAME llama_train.py ARGS...`. Prints one line a
configuration (the median step in ms and every call) and writes OUT_DIR/NAME.json (the measured
check's result). `tpudiag estimate fixtures/programs/llama_train.py:step --target v5e:1x1 -- ARGS`
is the estimate to set beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[1] / "fixtures" / "programs" / "llama_train.py"


def main() -> int:
    from tpudiag.api.measured_step import measure_step

    ap = argparse.ArgumentParser()
    ap.add_argument("configs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    for line in a.configs.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, *argv = line.split()
        if only and name not in only:
            continue
        t = time.time()
        doc = measure_step(PROGRAM, "step", argv, {"fsdp": 1}, calls=a.calls)
        (a.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
        got = (f"median {doc['step_s'] * 1e3:.3f} ms, calls " + " ".join(f"{s * 1e3:.2f}" for s in doc["step_s_each"])
               if "step_s" in doc else f"error: {doc['error']}")
        print(f"{name}: {got} (wall {time.time() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    from tpudiag.errors import InputError

    try:
        raise SystemExit(main())
    except InputError as e:  # no TPU here
        raise SystemExit(f"chip_steps: {e}")
