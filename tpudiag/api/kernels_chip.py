"""`tpudiag kernels bench` on a TPU: the on-chip timing, run in a worker process
(capture/chip_bench.py) before anything here loads libtpu, so that the worker holds the chip alone.

A variant that faults the runtime ends the worker; it is a failed row carrying the worker's last
words, and a new worker times the kernels after it. A worker is stopped when tpudiag is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tpudiag.capture import workers
from tpudiag.errors import InputError

REQUEST, RESULTS, LOG, TRACES = "chip-bench-request.json", "chip-bench.jsonl", "chip-bench.log", "chip-traces"
PER_KERNEL_S = 300  # a worker that times one kernel for longer than this is stopped


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last_words(log: Path, since: int) -> str:
    text = log.read_text(errors="replace")[since:] if log.exists() else ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("WARNING", "I0000"))]
    return " | ".join(lines[-3:])[:500] or "no message"


def _run_worker(request: Path, results: Path, log: Path, kernels: list[str]) -> tuple[int, str]:
    """One bench worker over `kernels`; (exit code, its last words)."""
    return run_chip_worker("tpudiag.capture.chip_bench", request, results, log, 60 + PER_KERNEL_S * len(kernels))


def run_chip_worker(module: str, request: Path, results: Path, log: Path, limit_s: float) -> tuple[int, str]:
    """`python -m MODULE REQUEST RESULTS` as the chip's one user, stopped after `limit_s` seconds or
    with tpudiag; (exit code, its last words)."""
    env = dict(os.environ, JAX_PLATFORMS="tpu", PYTHONUNBUFFERED="1")
    env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)  # the worker is the chip's one user
    start = log.stat().st_size if log.exists() else 0
    with log.open("a") as err:
        proc = workers.popen([sys.executable, "-m", module, str(request), str(results)],
                             stdout=err, stderr=err, env=env)
        try:
            deadline = time.monotonic() + limit_s
            while proc.poll() is None:
                if workers.stopping():
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    return -9, f"stopped after {limit_s:.0f} s"
                time.sleep(0.2)
        finally:
            if proc.poll() is None:  # interrupted: the worker goes with us
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            workers.forget(proc)
    if workers.stopping():
        raise KeyboardInterrupt
    return proc.returncode, _last_words(log, start)


def _no_backend(code: int, device, words: str) -> None:
    if code == 3 and device is None:
        held = "in use" in words or "busy" in words
        raise InputError("kernels: " + ("another program holds the TPU" if held else "no TPU backend here")
                         + f" ({words})")


def chip_tune_times(kernel: str, points: list[dict], candidates: bool, target_text: str, calls: int,
                    rotate_bytes: int, run: Path, progress: Callable[[str], None] | None = None
                    ) -> tuple[str, dict[int, dict]]:
    """`kernels tune` on the attached TPU: (the device's kind, point index -> the worker's row for
    `kernel` at that point). A point that ends the worker is a failed row; a new worker times the
    points after it."""
    request, results, log = run / REQUEST, run / RESULTS, run / LOG
    remaining, device, rows = list(range(len(points))), None, {}
    while remaining:
        request.write_text(json.dumps({"tune": {"kernel": kernel, "points": [[i, points[i]] for i in remaining],
                                                "candidates": candidates},
                                       "target": target_text, "calls": calls, "rotate_bytes": rotate_bytes,
                                       "traces": str(run / TRACES)}))
        seen = len(_read(results))
        code, words = _run_worker(request, results, log, [kernel] * max(1, len(remaining) // 4))
        for row in _read(results)[seen:]:
            if "device" in row:
                device = row["device"]
                continue
            i = int(row["variant"][len("point"):])
            rows[i] = row
            if progress and row.get("status") == "ok":
                progress(f"chip: point {i} {row['min_us']:.1f} us (min of {row['runs']})")
        _no_backend(code, device, words)
        if code == 0:
            break
        at = next((i for i in remaining if rows.get(i, {}).get("status") in (None, "running")), None)
        if at is None:
            break
        rows[at] = {"kernel": kernel, "variant": f"point{at:03d}", "calls": calls, "status": "failed",
                    "error": f"the chip worker exited {code}: {words}"}
        remaining = [i for i in remaining if i > at and rows.get(i, {}).get("status") in (None, "running")]
    return device or "TPU", rows


def chip_times(names: list[str], target_text: str, calls: int, rotate_bytes: int, run: Path,
               progress: Callable[[str], None] | None = None) -> tuple[str, dict[str, dict[str, dict]]]:
    """Time `names`' bench variants on the attached TPU: (the device's kind, kernel -> variant -> the
    worker's row). No TPU backend is an InputError naming why (none attached, or another program
    holds it)."""
    request, results, log = run / REQUEST, run / RESULTS, run / LOG
    remaining, device, rows = list(names), None, {}
    while remaining:
        request.write_text(json.dumps({"kernels": remaining, "target": target_text, "calls": calls,
                                       "rotate_bytes": rotate_bytes, "traces": str(run / TRACES)}))
        seen = len(_read(results))
        code, words = _run_worker(request, results, log, remaining)
        new = _read(results)[seen:]
        for row in new:
            if "device" in row:
                device = row["device"]
            else:
                rows.setdefault(row["kernel"], {})[row["variant"]] = row
                if progress and row.get("status") == "ok":
                    progress(f"chip: {row['kernel']}.{row['variant']} {row['min_us']:.1f} us (min of {row['runs']})")
        _no_backend(code, device, words)
        done = [k for k in remaining if k in rows and all(r.get("status") != "running" for r in rows[k].values())]
        if code == 0:
            break
        # The worker died: the kernel it was on failed, and a new worker takes the ones after it.
        at = next((k for k in remaining if k not in done), None)
        if at is None:
            break
        for variant, row in rows.setdefault(at, {}).items():
            if row.get("status") == "running":
                rows[at][variant] = {**row, "status": "failed", "error": f"the chip worker exited {code}: {words}"}
        if not rows[at]:
            rows[at]["kernel"] = {"kernel": at, "variant": "kernel", "status": "failed", "calls": calls,
                                  "error": f"the chip worker exited {code}: {words}"}
        if progress:
            progress(f"chip: {at} failed (worker exit {code}); going on")
        remaining = remaining[remaining.index(at) + 1:]
    return device or "TPU", rows
