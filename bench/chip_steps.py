"""Time `fixtures/programs/llama_train.py` steps on an attached TPU with tpudiag's own step timer
(`tpudiag.capture.step_timer`: 2 warm-up calls, then CALLS timed calls, each until its outputs are
ready), one process a configuration, so each holds the chip alone.

    python bench/chip_steps.py CONFIGS.txt OUT_DIR [--calls 6] [--platform tpu] [--only NAME,NAME]

CONFIGS.txt: one configuration a line, `NAME llama_train.py ARGS...`. Prints one line a
configuration (the median step in ms and every call) and leaves OUT_DIR/NAME.json, the timer's own
document. `tpudiag estimate fixtures/programs/llama_train.py:step --target v5e:1x1 -- ARGS` is the
estimate to set beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--platform", default="tpu")
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
        spec = {"file": "fixtures/programs/llama_train.py", "func": "step", "argv": argv, "mesh": [["fsdp", 1]],
                "calls": a.calls, "out": str(a.out / f"{name}.json"), "platform": a.platform}
        spec_path = a.out / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        t = time.time()
        r = subprocess.run([sys.executable, "-m", "tpudiag.capture.step_timer", str(spec_path)],
                           capture_output=True, text=True)
        out = Path(spec["out"])
        doc = json.loads(out.read_text()) if out.is_file() else {"error": r.stderr.strip()[-400:]}
        steps = doc.get("step_s")
        got = (f"median {statistics.median(steps) * 1e3:.3f} ms, calls " + " ".join(f"{s * 1e3:.2f}" for s in steps)
               if steps else f"error: {doc.get('error')}")
        print(f"{name}: {got} (wall {time.time() - t:.0f} s, exit {r.returncode})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
