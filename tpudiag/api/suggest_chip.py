"""`tpudiag suggest --measure`: each suggestion's bundled kernel and its plain-JAX twin timed on the
attached TPU at the program's own matched shapes, by the chip worker of `kernels bench`
(capture/chip_bench.py: a process that holds the chip alone, device time from the profiler trace,
the fastest of N calls, argument sets rotated beyond VMEM).

Runs before `suggest` lowers or compiles anything in this process (that loads libtpu), so that the
worker holds the chip alone. The worker's request, results and log live in a temporary directory:
nothing is written beside the run. A kernel that faults the runtime ends the worker; it is a failed
row with the worker's last words, and a new worker times the suggestions after it. Returns
`analyze.suggest.chip.ChipTimes` per candidate; analyze/suggest/chip.py puts them in the report.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

from tpudiag.api.kernels_chip import LOG, REQUEST, RESULTS, _read, run_chip_worker
from tpudiag.errors import InputError, TpudiagError

NO_TPU = "suggest --measure: no TPU backend here"
PER_SUGGESTION_S = 300  # a worker that times one suggestion (two compiles, N calls each) longer than this is stopped


def require_tpu() -> None:
    """A one-line InputError where no TPU is attached: before any work, so nothing is half-done."""
    from tpudiag.capture.process import tpu_attached

    if not tpu_attached():
        raise InputError(f"{NO_TPU} (no /dev/accel* or /dev/vfio device files); run it on a machine with a TPU "
                         "attached, or drop --measure for the estimate")


def chip_requests(cands: list, indices) -> dict[int, dict]:
    """{candidate index: the worker's request for its kernel at its matched shapes}
    (kernels/at_shapes.request), forward and backward where its ops include the gradient; a
    candidate with no bundled kernel at its shapes has none."""
    from tpudiag.kernels.at_shapes import request, setup_for, with_backward

    out = {}
    for i in indices:
        c = cands[i]
        s = setup_for(c.match.detector, c.match.shapes, c.match.notes)
        if not isinstance(s, str) and c.backward:
            s = with_backward(s)
        if isinstance(s, str):
            continue
        out[i] = request(s.kernel, c.match.shapes.to_dict(), c.match.notes, c.backward, s)
    return out


def measure_on_chip(requests: dict[int, dict], target, calls: int,
                    progress: Callable[[str], None] | None = None) -> tuple[str, dict]:
    """Time each request's kernel and XLA twin on the attached TPU: (the device's kind, {candidate
    index: ChipTimes}). Candidates with the same kernel at the same shapes are timed once. No TPU
    backend, or a TPU of another chip than `target`'s, is a one-line InputError."""
    from tpudiag.analyze.suggest.chip import ChipTimes

    items, ids = [], {}  # one item per distinct setup; ids: candidate index -> its item's id
    for i, req in requests.items():
        key = json.dumps({k: v for k, v in req.items() if k != "description"}, sort_keys=True)
        same = next((it["id"] for it in items if it["key"] == key), None)
        if same is None:
            same = f"s{len(items):02d}_{req['kernel']}"
            items.append({**req, "id": same, "key": key})
        ids[i] = same
    if not items:
        return "TPU", {}
    with tempfile.TemporaryDirectory(prefix="tpudiag-suggest-chip-") as tmp:
        device, rows = _run(items, target, calls, Path(tmp), progress)
    _same_chip(device, target)
    out = {}
    for i, item_id in ids.items():
        got = rows.get(item_id, {})
        kernel, xla = got.get("kernel", {}), got.get("xla", {})
        errors = [f"{v}: {r['error']}" for v, r in (("kernel", kernel), ("xla", xla)) if r.get("error")]
        out[i] = ChipTimes(kernel_us=kernel.get("min_us") if kernel.get("status") == "ok" else None,
                           xla_us=xla.get("min_us") if xla.get("status") == "ok" else None,
                           shape=requests[i]["description"], error="; ".join(errors)[:600] or None)
    return device, out


def _run(items: list[dict], target, calls: int, tmp: Path, progress) -> tuple[str, dict[str, dict[str, dict]]]:
    """The worker over `items`, again after each one that ends it: (device kind, id -> variant -> row)."""
    request, results, log = tmp / REQUEST, tmp / RESULTS, tmp / LOG
    remaining, device, rows = list(items), None, {}
    while remaining:
        request.write_text(json.dumps({"at_shapes": [{k: v for k, v in it.items() if k != "key"} for it in remaining],
                                       "target": target.topology, "calls": calls,
                                       "rotate_bytes": 2 * target.chip.vmem_bytes}))
        if progress:
            progress(f"chip: timing {len(remaining)} kernel(s) and their XLA twins at the program's shapes "
                     f"({remaining[0]['kernel']} at {remaining[0]['description']} first)")
        seen = len(_read(results))
        code, words = run_chip_worker("tpudiag.capture.chip_bench", request, results, log,
                                      60 + PER_SUGGESTION_S * len(remaining))
        for row in _read(results)[seen:]:
            if "device" in row:
                device = row["device"]
                continue
            rows.setdefault(row["kernel"], {})[row["variant"]] = row
            if progress and row.get("status") in ("ok", "failed"):
                what = (f"{row['min_us']:.1f} us (min of {row['runs']})" if row["status"] == "ok"
                        else f"failed: {row.get('error', '')[:160]}")
                progress(f"chip: {row['kernel']}.{row['variant']} {what}")
        if code == 3 and device is None:
            held = "in use" in words or "busy" in words
            raise InputError(("suggest --measure: another program holds the TPU" if held else NO_TPU) + f" ({words})")
        if code == 0:
            break
        # The worker died: the suggestion it was on failed, and a new worker takes the ones after it.
        at = next((k for k, it in enumerate(remaining)
                   if any(r.get("status") == "running" for r in rows.get(it["id"], {}).values())
                   or it["id"] not in rows), None)
        if at is None:
            break
        item_id = remaining[at]["id"]
        got = rows.setdefault(item_id, {})
        for variant in ("kernel", "xla"):
            if got.get(variant, {}).get("status") in (None, "running"):
                got[variant] = {"kernel": item_id, "variant": variant, "status": "failed",
                                "error": f"the chip worker exited {code}: {words}"}
        if progress:
            progress(f"chip: {item_id} failed (worker exit {code}); going on")
        remaining = remaining[at + 1:]
    return device or "TPU", rows


def _same_chip(device: str, target) -> None:
    """The attached TPU must be the chip the suggestions are priced for: a v6e's times are not a v5e run's."""
    from tpudiag.targets import resolve_target

    try:
        chip = resolve_target(device).chip.name
    except TpudiagError:
        return  # a kind tpudiag cannot name: the report says which device timed it
    if chip != target.chip.name:
        raise InputError(f"suggest --measure: the attached TPU is a {chip} ({device}), and these suggestions are for "
                         f"{target.chip.name}; suggest on a run compiled for {chip} (tpudiag compile --target {chip})")
