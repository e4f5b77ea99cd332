"""Compiles modules for a TPU target, each in its own worker process, with the TPU compiler's dumps on.

For each module it writes `RUN/modules/<NN>-<name>/`: the input, `result.json` from the worker,
`compile.log` (libtpu's own output, shown to users only with --debug), XLA's HLO dumps (`hlo/`),
the final LLO bundles and slot utilization (`llo/`) and the static cycle profile
(`static_profile/`).

The static-profile flag is slow and fragile (../shared/TPU-NOTES.md: an 8k^3 matmul takes 1 s
without it and 117 s with it; it aborts on gathers and scatters and can grow past 10 GB), so a
module is first compiled with it under a time and memory limit, and if that fails compiled again
without it; `static_profile` in the result says which happened. A module compiled for the same
target before is copied from the compile cache instead (`compile_cache.py`). It parses nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tpudiag.capture import rundir
from tpudiag.capture.compile_cache import CompileCache

# The LLO dump narrowed to the final bundles and their slot utilization: without the regex
# libtpu writes every LLO pass (~100 MB for a tiny program).
_LLO_FLAGS = ("--xla_jf_dump_to={llo} --xla_jf_dump_llo_text=true "
              "--xla_jf_dump_llo_pass_label_regex=final_bundles|final_hlo-static-per-bundle-utilization")
_STATIC_FLAG = "--xla_jf_dump_static_llo_profile_to={static}"


@dataclass(frozen=True)
class ModuleInput:
    name: str  # e.g. "jit_train_step"
    path: Path  # StableHLO (.mlir, text or bytecode) or HLO text
    kind: str  # "mlir" | "hlo"


@dataclass(frozen=True)
class Limits:
    # CPU seconds (not wall: a busy machine slows a module, it does not shrink its budget) the static
    # profile of a module with up to `size_base_matmuls` matmuls may take; a module with more gets
    # proportionally more, up to `size_max_scale` times (`static_limit_s`). 60 s keeps a decoder
    # script at ~1 min (its RNG setup never finishes profiling, bench/RESULTS.md); TPU-NOTES: an
    # 8k^3 matmul needs 117 s: raise --timeout for those.
    static_timeout_s: float = 60.0
    scale_with_size: bool = True
    # A module's size for its budget is its matmuls (dot_general, dot and convolution ops in the
    # StableHLO or HLO text). The static profile earns its time on them: compute is what it models
    # well (TPU-NOTES), and a module without any (the random-number setup: ~1000 slices of one draw
    # in a 16-layer decoder) never finishes and gains nothing from a longer wait. One decoder
    # block's forward pass has 9 matmuls, its training step 27, a 16-layer training step 432
    # (fixtures/programs/decoder.py).
    size_base_matmuls: int = 9
    size_max_scale: float = 6.0
    # The wall-clock bound on a static-profile attempt, as a multiple of its CPU limit: a worker that
    # gets a quarter of a core is still waited for; one that gets nothing is not waited for forever.
    wall_per_cpu: float = 4.0
    compile_timeout_s: float = 300.0  # plain compile, wall seconds
    memory_bytes: int = 8 << 30  # the static profile can balloon past 10 GB on sorts, top_k and long sequences


_MATMUL = re.compile(rb"stablehlo\.(?:dot_general|dot|convolution)\b|\s(?:dot|convolution)\(")


def module_matmuls(path: Path) -> int | None:
    """Matmul operations in a module's text (StableHLO or HLO); None for MLIR bytecode."""
    data = path.read_bytes()
    if data[:4] == b"ML\xefR":  # MLIR bytecode magic
        return None
    return len(_MATMUL.findall(data))


def static_limit_s(path: Path, limits: Limits) -> float:
    """The CPU seconds the static profile of the module at `path` may take under `limits`."""
    if not limits.scale_with_size:
        return limits.static_timeout_s
    n = module_matmuls(path)
    scale = 1.0 if n is None else min(limits.size_max_scale, max(1.0, n / limits.size_base_matmuls))
    return round(limits.static_timeout_s * scale, 3)


@dataclass(frozen=True)
class ModuleStarted:
    """A progress event: a module's compile began (`static_limit_s` None: without the static profile)."""

    name: str
    static_limit_s: float | None
    cpu_s: Callable[[], float]  # CPU seconds its worker has used so far


@dataclass(frozen=True)
class ModuleCompile:
    name: str
    dir: Path
    status: str  # "ok" | "failed"
    error: str | None
    static_profile: str  # "ok" | "off" | why it was dropped ("timeout after 120 s", "aborted: ...")
    result: dict
    cached: str | None = None  # the compile-cache entry it was copied from; None: compiled here
    static_limit_s: float | None = None  # the static profile's CPU-second limit (None: off, or an older run)


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _last_error_line(log: Path) -> str:
    """libtpu aborts with a line like `F... Static LLO profiling of fusion.3 failed: ...`."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    for ln in reversed(lines):
        if ln[:1] in "FE" and ("failed" in ln or "Check failed" in ln or "INVALID_ARGUMENT" in ln):
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class _Worker:
    """The CPU seconds of the running attempt, for the progress line."""

    def __init__(self):
        self.pid: int | None = None

    def cpu_s(self) -> float:
        return _cpu_s(self.pid) if self.pid else 0.0


def _attempt(spec_path: Path, mdir: Path, static: bool, limit_s: float, memory_bytes: int,
             worker: _Worker | None = None, wall_per_cpu: float = Limits.wall_per_cpu) -> tuple[str, str | None]:
    """Run one worker. Returns (outcome, detail): "ok", "failed" (compiler said no), "timeout", "memory", "crashed".

    With the static profile, `limit_s` is CPU seconds (and `wall_per_cpu` times that in wall seconds);
    without, wall seconds. libtpu splits LIBTPU_INIT_ARGS on spaces and takes quotes literally, so
    its dumps go to a space-free temporary directory and are moved into the module directory afterwards.
    """
    (mdir / rundir.MODULE_RESULT).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="tpudiag-dump-") as tmp:
        try:
            return _run_worker(spec_path, mdir, _env(mdir, Path(tmp), static), limit_s if static else None,
                               limit_s * wall_per_cpu if static else limit_s, memory_bytes, worker or _Worker())
        finally:
            for sub in (rundir.LLO_DIR, rundir.STATIC_PROFILE_DIR):
                if (Path(tmp) / sub).is_dir():
                    shutil.rmtree(mdir / sub, ignore_errors=True)
                    shutil.move(str(Path(tmp) / sub), str(mdir / sub))


def _run_worker(spec_path: Path, mdir: Path, env: dict, cpu_limit_s: float | None, wall_limit_s: float,
                memory_bytes: int, worker: _Worker) -> tuple[str, str | None]:
    with open(mdir / "compile.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tpudiag.capture.tpu_worker", str(spec_path)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        worker.pid = proc.pid
        start = time.monotonic()
        try:
            while proc.poll() is None:
                wall = time.monotonic() - start
                if cpu_limit_s is not None and _cpu_s(proc.pid) > cpu_limit_s:
                    proc.kill()
                    proc.wait()
                    return "timeout", f"timed out after {cpu_limit_s:.0f} s of CPU ({wall:.0f} s wall)"
                if wall > wall_limit_s:
                    proc.kill()
                    proc.wait()
                    return "timeout", f"timed out after {wall_limit_s:.0f} s wall"
                if _rss_bytes(proc.pid) > memory_bytes:
                    proc.kill()
                    proc.wait()
                    return "memory", f"used more than {memory_bytes / 2**30:g} GiB"
                time.sleep(0.05)
        finally:
            worker.pid = None
    result = mdir / rundir.MODULE_RESULT
    if proc.returncode != 0 or not result.exists():
        return "crashed", f"the TPU compiler aborted (exit {proc.returncode}): {_last_error_line(mdir / 'compile.log')}"
    doc = json.loads(result.read_text())
    return ("ok", None) if doc.get("status") == "ok" else ("failed", doc.get("error"))


def _env(mdir: Path, dump: Path, static: bool) -> dict:
    env = dict(os.environ)
    libtpu = _LLO_FLAGS.format(llo=dump / rundir.LLO_DIR)
    if static:
        libtpu += " " + _STATIC_FLAG.format(static=dump / rundir.STATIC_PROFILE_DIR)
    env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + " " + libtpu).strip()
    dump_to = mdir / rundir.HLO_DIR
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f' --xla_dump_to="{dump_to}" --xla_dump_hlo_as_text').strip()
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # several workers load libtpu at once
    env["JAX_PLATFORMS"] = "cpu"  # the compile-only client needs no TPU; skip libtpu's device probe
    env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def compile_module(inp: ModuleInput, mdir: Path, topology: str, static_profile: bool, limits: Limits,
                   cache: CompileCache | None = None,
                   started: Callable[[ModuleStarted], None] | None = None) -> ModuleCompile:
    """Compile one module into `mdir`, or copy it from `cache` when the same module was compiled
    for the same target before (`cached` in module.json then names the entry). `started` hears when
    a compile (not a cache copy) begins."""
    mdir.mkdir(parents=True, exist_ok=True)
    suffix = ".mlir" if inp.kind == "mlir" else ".hlo.txt"
    local = mdir / f"input{suffix}"
    shutil.copyfile(inp.path, local)
    spec = mdir / "spec.json"
    spec.write_text(json.dumps({"input": str(local), "kind": inp.kind, "topology": topology, "out_dir": str(mdir)}))
    limit_s = static_limit_s(local, limits)
    # The user's LIBTPU_INIT_ARGS change what the compiler makes (async collectives, VMEM limits):
    # part of the key, with ours.
    flags = " ".join((os.environ.get("LIBTPU_INIT_ARGS", ""), _LLO_FLAGS, _STATIC_FLAG)).strip()
    key = cache.key(local, inp.kind, topology, static_profile, flags) if cache else None
    hit = bool(key) and cache.fetch(key, mdir, limit_s, limits.memory_bytes)
    if hit:
        cached = load_module(mdir)
        res = ModuleCompile(inp.name, mdir, cached.status, cached.error, cached.static_profile, cached.result, key,
                            cached.static_limit_s)
    else:
        worker = _Worker()
        if started:
            started(ModuleStarted(inp.name, limit_s if static_profile else None, worker.cpu_s))
        res = _compile_module(inp, mdir, spec, static_profile, limits, limit_s, worker)
    # What happened, for `tpudiag report RUN` to re-render without recompiling; `cached` names the
    # cache entry the module came from (None: compiled here).
    meta = {"name": res.name, "status": res.status, "error": res.error, "static_profile": res.static_profile,
            "cached": res.cached, "static_limit_s": res.static_limit_s}
    (mdir / rundir.MODULE_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    if key and not hit:
        cache.store(key, mdir, res.status, res.static_profile, limit_s, limits.memory_bytes)
    return res


def load_module(mdir: Path) -> ModuleCompile:
    """A module compiled earlier, from its `module.json` and `result.json`."""
    meta = json.loads((mdir / rundir.MODULE_JSON).read_text())
    result = json.loads((mdir / rundir.MODULE_RESULT).read_text()) if meta["status"] == "ok" else {}
    return ModuleCompile(meta["name"], mdir, meta["status"], meta["error"], meta["static_profile"], result,
                         meta.get("cached"), meta.get("static_limit_s"))


def _compile_module(inp: ModuleInput, mdir: Path, spec: Path, static_profile: bool, limits: Limits, limit_s: float,
                    worker: _Worker) -> ModuleCompile:
    static_note, shown_limit = "off", None
    if static_profile:
        shown_limit = limit_s
        outcome, detail = _attempt(spec, mdir, True, limit_s, limits.memory_bytes, worker, limits.wall_per_cpu)
        if outcome == "ok":
            return _done(inp, mdir, "ok", shown_limit)
        if outcome == "failed":  # the compiler rejected the module itself: no point retrying
            return ModuleCompile(inp.name, mdir, "failed", detail, "not reached: the module failed to compile", {},
                                 None, shown_limit)
        static_note = f"dropped: {detail}"
        for sub in (rundir.LLO_DIR, rundir.STATIC_PROFILE_DIR, rundir.HLO_DIR):  # partial dumps of the aborted attempt
            shutil.rmtree(mdir / sub, ignore_errors=True)
    # The plain compile never balloons as the static profile does: a smaller static-profile limit
    # does not apply to it.
    outcome, detail = _attempt(spec, mdir, False, limits.compile_timeout_s,
                               max(limits.memory_bytes, Limits.memory_bytes), worker)
    if outcome != "ok":
        return ModuleCompile(inp.name, mdir, "failed", detail, static_note, {}, None, shown_limit)
    return _done(inp, mdir, static_note, shown_limit)


def _done(inp: ModuleInput, mdir: Path, static_note: str, limit_s: float | None) -> ModuleCompile:
    return ModuleCompile(inp.name, mdir, "ok", None, static_note, json.loads((mdir / rundir.MODULE_RESULT).read_text()),
                         None, limit_s)


_FROM_ENV = object()


def compile_modules(inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool = True,
                    limits: Limits = Limits(), jobs: int = 2,
                    progress: Callable[[ModuleCompile | ModuleStarted], None] | None = None,
                    cache=_FROM_ENV) -> list[ModuleCompile]:
    """Compile every input (up to `jobs` at once); failures are results, never exceptions. `cache`:
    a `CompileCache`, None for none, or (the default) the one the environment names. `progress`
    hears a `ModuleStarted` when a module's compile begins and its `ModuleCompile` when it ends."""
    dirs = [modules_dir / f"{i:02d}-{inp.name}" for i, inp in enumerate(inputs)]
    cache = CompileCache.from_env() if cache is _FROM_ENV else cache

    def one(args):
        inp, mdir = args
        res = compile_module(inp, mdir, topology, static_profile, limits, cache, started=progress)
        if progress:
            progress(res)
        return res

    # Largest first: the module with the most work (the training step, not the random-number
    # setup) starts at once, never after small ones have taken the workers; results keep input order.
    order = sorted(range(len(inputs)), key=lambda i: -inputs[i].path.stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = dict(zip(order, pool.map(one, [(inputs[i], dirs[i]) for i in order])))
    return [done[i] for i in range(len(inputs))]
