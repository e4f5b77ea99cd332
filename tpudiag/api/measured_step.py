"""The measured check of an estimate: a step function run for real on the attached TPU
(capture/step_timer.py, in a worker that holds the chip alone), its median step time.

`capture.process.tpu_attached()` says whether this machine has a TPU device file. A step that cannot
run (FUNC refused, jax or the program failed) is a result with its one-line error, not an exception;
no TPU is an InputError.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from tpudiag.errors import InputError

CALLS = 5
LIMIT_S = 600  # the worker's whole run: the program's setup, its compile and the calls


def measure_step(path: Path, func: str, argv: list[str], mesh: dict[str, int], calls: int = CALLS) -> dict:
    """{"device", "step_s" (median), "runs", "step_s_each"} for FUNC's step on the attached chip, or
    {"error": one line}."""
    from tpudiag.api.kernels_chip import run_chip_worker

    with tempfile.TemporaryDirectory(prefix="tpudiag-step-") as tmp:
        tmp = Path(tmp)
        spec, out, log = tmp / "spec.json", tmp / "result.json", tmp / "worker.log"
        spec.write_text(json.dumps({"file": str(path), "func": func, "argv": list(argv), "calls": calls,
                                    "mesh": [[a, n] for a, n in mesh.items()], "out": str(out)}))
        code, words = run_chip_worker("tpudiag.capture.step_timer", spec, out, log, LIMIT_S)
        if code == 3:
            raise InputError(f"measured check: no TPU backend here ({words.split(' | ')[-1]})")
        if not out.is_file():
            return {"error": f"the step worker exited {code}: {words}"}
        doc = json.loads(out.read_text())
    if "error" in doc:
        return {"error": doc["error"]}
    times = doc["step_s"]
    return {"device": doc["device"], "step_s": statistics.median(times), "runs": len(times),
            "step_s_each": [round(t, 6) for t in times]}
