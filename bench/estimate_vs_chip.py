"""`tpudiag estimate` op by op against a step traced on a TPU: where the estimate's time differs from
the chip's.

    python bench/estimate_vs_chip.py CHIP_RUN ESTIMATE_RUN [--top N]

CHIP_RUN: `tpudiag profile` of the program on the chip (fixtures/tpu-v5e/llama_train); ESTIMATE_RUN:
`tpudiag estimate ... --target v5e:1x1 --out DIR` of the same program and arguments. Per step: the
chip's measured self time per op (the report's ops over its steps), the estimate's op time x runs
(its compile report), joined by HLO op name, then by XProf category where names differ. Prints the
categories, the joined ops grouped by where the estimate took each one's time (a matmul probe's
cycles, bytes at HBM bandwidth, ...), and the ops with the largest differences.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def chip_ops(run: Path) -> tuple[dict[str, dict], float, int]:
    doc = json.loads(subprocess.run([sys.executable, "-m", "tpudiag", "report", "--json", str(run)],
                                    capture_output=True, text=True, check=True).stdout)
    steps = doc["device"]["in_steps"]["steps"]
    ops = {o["name"]: {"s": o["self_s"] / steps, "category": o.get("category"), "opcode": o.get("opcode")}
           for o in doc["ops"] if o.get("module", "").startswith("jit_train_step") or True}
    return ops, doc["device"]["in_steps"]["median"]["step_s"], steps


def estimate_ops(run: Path) -> tuple[dict[str, dict], float]:
    est = json.loads((run / "estimate.json").read_text())
    report = json.loads((run / "report.json").read_text())
    (m,) = [m for m in report["modules"] if m.get("ops")]
    ops = {o["name"]: {"s": o["estimated_s"] * o.get("runs", 1), "category": o["category"], "opcode": o["opcode"],
                       "bound_by": o["bound_by"], "source": o["cycles_source"]} for o in m["ops"]}
    return ops, est["step_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("chip", type=Path)
    ap.add_argument("estimate", type=Path)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    chip, chip_step, steps = chip_ops(a.chip)
    est, est_step = estimate_ops(a.estimate)
    both = sorted(set(chip) & set(est), key=lambda n: -abs(chip[n]["s"] - est[n]["s"]))
    print(f"step: chip {chip_step * 1e3:.2f} ms (median of {steps}); estimate {est_step * 1e3:.2f} ms "
          f"({est_step / chip_step:.2f}x)")
    print(f"ops: chip {len(chip)}, estimate {len(est)}, same name {len(both)}; "
          f"chip time in joined ops {sum(chip[n]['s'] for n in both) * 1e3:.2f} ms of "
          f"{sum(o['s'] for o in chip.values()) * 1e3:.2f}; estimate {sum(est[n]['s'] for n in both) * 1e3:.2f} ms "
          f"of {sum(o['s'] for o in est.values()) * 1e3:.2f}")
    by = defaultdict(lambda: [0.0, 0.0])
    for n, o in chip.items():
        by[est.get(n, o)["category"]][0] += o["s"]
    from tpudiag.analyze.hlo.vocabulary import ASYNC_COPY

    hidden = sum(o["s"] for o in est.values() if o["opcode"] in ASYNC_COPY)
    for n, o in est.items():
        if o["opcode"] not in ASYNC_COPY:  # the estimate counts them overlapped with compute
            by[o["category"]][1] += o["s"]
    print(f"\n{'category':34} {'chip ms':>9} {'est ms':>9} {'est/chip':>9}")
    for cat, (c, e) in sorted(by.items(), key=lambda kv: -max(kv[1])):
        print(f"{cat:34} {c * 1e3:9.2f} {e * 1e3:9.2f} {e / c if c else float('nan'):9.2f}")
    print(f"(asynchronous copies, overlapped in the estimate: {hidden * 1e3:.2f} ms)")
    src = defaultdict(lambda: [0.0, 0.0, 0])
    for n in both:
        row = src[f"{est[n]['source']}/{est[n]['bound_by']}"]
        row[0], row[1], row[2] = row[0] + chip[n]["s"], row[1] + est[n]["s"], row[2] + 1
    print(f"\n{'where the estimate took the time':34} {'ops':>5} {'chip ms':>9} {'est ms':>9} {'est/chip':>9}")
    for key, (c, e, k) in sorted(src.items(), key=lambda kv: -kv[1][0]):
        print(f"{key:34} {k:5d} {c * 1e3:9.2f} {e * 1e3:9.2f} {e / c if c else float('nan'):9.2f}")
    print(f"\n{'op':40} {'category':24} {'chip us':>9} {'est us':>9} {'est/chip':>8}  estimate from")
    for n in both[: a.top]:
        c, e = chip[n]["s"], est[n]["s"]
        print(f"{n[:40]:40} {est[n]['category'][:24]:24} {c * 1e6:9.1f} {e * 1e6:9.1f} {e / c if c else 0:8.2f}  "
              f"{est[n]['source']}/{est[n]['bound_by']}")


if __name__ == "__main__":
    main()
