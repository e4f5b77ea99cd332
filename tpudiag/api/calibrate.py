"""`tpudiag calibrate`: time the microbenchmarks on the attached TPU (capture/calibrate_chip.py, in a
worker that holds the chip alone) and write the chip's calibration table; or read a table back
(`load_calibration`: a file, or the one tpudiag ships for a chip).

Beside the square bf16 matmul's time the table records the TPU compiler's static cycles for the same
matmul (`square_static_cycles`), so that an estimate can set the compiler's cycles against the chip's.

The table is written whole or not at all (a temporary file renamed into place). No TPU, or another
program holding it, is one line naming why.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from tpudiag.errors import InputError

LIMIT_S = 900  # the worker's whole run; about 2 minutes on a v5e


def _chip_of_device(kind: str) -> str:
    """jax's device kind ("TPU v5 lite") as a chip name of targets.py ("v5e")."""
    from tpudiag.targets import resolve_target

    text = kind.lower().replace("tpu", "").strip()
    aliases = {"v5 lite": "v5e", "v5litepod": "v5e", "v5": "v5p", "v6 lite": "v6e", "v6e": "v6e", "v4": "v4",
               "7x": "tpu7x"}
    name = aliases.get(text, text.replace(" ", ""))
    try:
        return resolve_target(name).chip.name
    except InputError:
        return name


def measure(out: Path, calls: int = 10, only: tuple[str, ...] = (), force: bool = False,
            progress: Callable[[str], None] | None = None, command: str = "tpudiag calibrate"):
    """Run the microbenchmarks on the attached TPU and write the calibration to `out` (recording
    `command`, the command line that asked). Returns the Calibration."""
    from tpudiag.api.kernels_chip import _read, run_chip_worker
    from tpudiag.capture.process import tpu_attached
    from tpudiag.results.calibration import Calibration, measurement_of_row

    out = Path(out)
    if out.exists() and not force:
        raise InputError(f"{out}: already exists; tpudiag never overwrites a calibration (--force, or another --out)")
    if out.parent and not out.parent.is_dir():
        raise InputError(f"{out.parent}: no such directory for --out")
    if not tpu_attached():  # before any work: no device files, nothing to open
        raise InputError("calibrate: no TPU backend here (no /dev/accel* or /dev/vfio device files); run it on "
                         "a machine with a TPU attached, or read the shipped table with --show v5e")
    with tempfile.TemporaryDirectory(prefix="tpudiag-calibrate-") as tmp:
        tmp = Path(tmp)
        request, results, log = tmp / "request.json", tmp / "results.jsonl", tmp / "worker.log"
        request.write_text(json.dumps({"calls": calls, "only": list(only)}))
        if progress:
            progress("timing the microbenchmarks on the TPU (about 2 minutes)")
        code, words = run_chip_worker("tpudiag.capture.calibrate_chip", request, results, log, LIMIT_S)
        rows = _read(results)
        head = next((r for r in rows if "device" in r), None)
        if head is None:
            words = words.split(" | ")[-1]  # the worker's own one line; before it, libtpu's log
            held = "in use" in words or "busy" in words
            raise InputError("calibrate: " + ("another program holds the TPU" if held else "no TPU backend here")
                             + f" ({words})")
        measured = [measurement_of_row(r) for r in rows if "name" in r]
        if code != 0:
            raise InputError(f"calibrate: the chip worker exited {code} after {len(measured)} measurement(s): {words}")
    chip = _chip_of_device(head["device"])
    measured = [_with_static_cycles(m, chip, progress) if m.name == "mxu_bf16_square" and m.status == "ok" else m
                for m in measured]
    cal = Calibration(chip=chip, device=head["device"], jax=head.get("jax", "?"),
                      date=datetime.date.today().isoformat(), command=command, measurements=tuple(measured))
    if progress:
        failed = [m.name for m in measured if m.status != "ok"]
        progress(f"{len(measured) - len(failed)} of {len(measured)} measured" +
                 (f"; failed: {', '.join(failed)}" if failed else ""))
    _write_whole(out, json.dumps(cal.to_dict(), indent=1, sort_keys=True) + "\n")
    return cal


def square_static_cycles(chip: str) -> int:
    """The TPU compiler's static cycles for the calibration's square matmul (bf16[4096,4096] @
    bf16[4096,4096], f32 out) compiled for `chip` (a compile with the static profile, about 20 s)."""
    from tpudiag.api.compile import compile_function
    from tpudiag.capture.calibrate_chip import programs
    from tpudiag.capture.tpu_compile import Limits

    (square,) = [p for p in programs() if p["name"] == "mxu_bf16_square"]  # the matmul the chip timed
    with tempfile.TemporaryDirectory(prefix="tpudiag-calibrate-static-") as tmp:
        res = compile_function(square["fn"], *square["args"], target=chip, out=Path(tmp) / "run",
                               static_profile=True, jobs=1, limits=Limits(fast_forward=False))
    cycles = sum(o.estimated_cycles or 0 for m in res.report.modules for o in m.ops if o.flops > 0)
    if not cycles:
        raise InputError(f"calibrate: the static profile of the square matmul for {chip} gave no cycles")
    return cycles


def _with_static_cycles(m, chip: str, progress):
    """The square matmul's measurement with the compiler's static cycles beside it; as it was, with a
    progress line, where the static profile cannot be had."""
    from dataclasses import replace

    if progress:
        progress("the square matmul's static cycles (one compile with the static profile)")
    try:
        cycles = square_static_cycles(chip)
    except Exception as e:  # the measurement stands without it; the estimate then keeps the probes' cycles
        if progress:
            progress(f"no static cycles for mxu_bf16_square ({str(e).splitlines()[0][:200]})")
        return m
    return replace(m, work={**m.work, "static_cycles": cycles})


def _write_whole(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


TABLES = Path(__file__).resolve().parent.parent / "tables"


def read_calibration(path: Path):
    """A calibration file; an InputError naming the file where it is not one."""
    from tpudiag.results.calibration import Calibration

    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such calibration file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a calibration file ({type(e).__name__}: {e})") from None
    try:
        return Calibration.from_dict(doc)
    except ValueError as e:
        raise InputError(f"{path}: {e}") from None


def shipped(chip: str):
    """The calibration tpudiag ships for `chip` (tables/calibration_CHIP.json), or None."""
    path = TABLES / f"calibration_{chip}.json"
    return read_calibration(path) if path.is_file() else None


def load_calibration(source: str | Path | None, chip: str):
    """The calibration to use for `chip`: the file `source`, or (None) the table tpudiag ships for
    the chip, or None where it ships none. A file measured on another chip is an InputError."""
    if source is None:
        return shipped(chip)
    cal = read_calibration(Path(source))
    if cal.chip != chip:
        raise InputError(f"{source}: a calibration of {cal.chip} ({cal.device}); the target is {chip}")
    return cal
