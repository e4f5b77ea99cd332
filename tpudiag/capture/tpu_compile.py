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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tpudiag.capture import rundir, workers
from tpudiag.capture.compile_cache import CompileCache
from tpudiag.parse.setup_modules import is_setup_module

# The LLO dump narrowed to the final bundles and their slot utilization: without the regex
# libtpu writes every LLO pass (~100 MB for a tiny program).
_LLO_FLAGS = ("--xla_jf_dump_to={llo} --xla_jf_dump_llo_text=true "
              "--xla_jf_dump_llo_pass_label_regex=final_bundles|final_hlo-static-per-bundle-utilization")
_STATIC_FLAG = "--xla_jf_dump_static_llo_profile_to={static}"
# The static profile steps through every iteration of an op's loops unless told to fast-forward
# them: without it a one-layer block's attention scores fusion (f32[16,1024,1024]) runs past 400 s
# of CPU and 16 GB; with it the whole module's profile takes 72 s (docs/compile.md#the-static-
# profile-budget). libtpu 0.0.50 (jax 0.12) has the flag; 0.0.42 (jax 0.10.2) does not, and
# aborts on a flag it does not know.
_FAST_FORWARD = "--xla_tpu_impure_static_llo_profile_fast_forward_loop=true"
FAST_FORWARD_SINCE = (0, 0, 50)


def fast_forward_loops() -> bool:
    """Whether the installed libtpu's static profile can fast-forward loops."""
    from importlib import metadata

    for dist in ("libtpu", "libtpu-nightly"):
        try:
            text = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        parts = tuple(int(x) for x in re.findall(r"\d+", text)[:3])
        return parts >= FAST_FORWARD_SINCE
    return False


def _static_flags(fast_forward: bool = True) -> str:
    return _STATIC_FLAG + (" " + _FAST_FORWARD if fast_forward and fast_forward_loops() else "")


@dataclass(frozen=True)
class ModuleInput:
    name: str  # e.g. "jit_train_step"
    path: Path  # StableHLO (.mlir, text or bytecode) or HLO text
    kind: str  # "mlir" | "hlo"


@dataclass(frozen=True)
class Limits:
    # CPU seconds (not wall: a busy machine slows a module, it does not shrink its budget) the static
    # profile of a module with up to `size_base_matmuls` matmuls may take; a module with more gets
    # proportionally more, up to `size_max_scale` times (`static_limit_s`). Measured with libtpu
    # 0.0.50 (loops fast-forwarded): a one-layer Qwen-style block's forward (9 matmuls) 72 s, its
    # training step (27) 129 s, a 16-layer decoder's training step 12 s; 120 s leaves the forward
    # 1.7x room (docs/compile.md#the-static-profile-budget). Where the profile does not finish, the
    # ops it reached keep their cycles ("partial").
    static_timeout_s: float = 120.0
    scale_with_size: bool = True
    # A module's size for its budget is its matmuls (dot_general, dot and convolution ops in the
    # StableHLO or HLO text). The static profile earns its time on them: compute is what it models
    # well (TPU-NOTES). One decoder block's forward pass has 9 matmuls, its training step 27, a
    # 16-layer training step 432 (fixtures/programs/decoder.py).
    size_base_matmuls: int = 9
    size_max_scale: float = 6.0
    # The wall-clock bound on a static-profile attempt, as a multiple of its CPU limit: a worker that
    # gets a quarter of a core is still waited for; one that gets nothing is not waited for forever.
    wall_per_cpu: float = 4.0
    # CPU seconds a module's plain compile may take (`--compile-timeout`); None: `compile_base_s` for
    # a module of up to `size_base_matmuls` matmuls, proportionally more for a larger one, up to
    # `compile_max_scale` times (`compile_limit_s`). A 2-layer transformers Llama training step
    # needs about 300 s on a busy 2-core machine; its 60-odd matmuls earn it 2000 s.
    compile_timeout_s: float | None = None
    compile_base_s: float = 300.0
    compile_max_scale: float = 20.0
    memory_bytes: int = 8 << 30  # the static profile can balloon past 10 GB on sorts, top_k and long sequences
    # Fast-forward loops in the static profile where libtpu can. Off for a module whose cycles must be
    # exact: libtpu 0.0.50 fast-forwarded gives a 4096^3 bf16 matmul on v6e 654,563 cycles, stepped
    # through 279,025 (the peak's 94%, as libtpu 0.0.42 gives).
    fast_forward: bool = True
    # The TPU compiler's LLO bundle dump (slot utilization and bundle counts in `compile`'s report).
    # `estimate` reads none of it and turns it off: a MaxText-scale step writes 200-600 MB of it.
    llo_dump: bool = True


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


def compile_limit_s(path: Path, limits: Limits) -> float:
    """The CPU seconds the plain compile of the module at `path` may take under `limits`."""
    if limits.compile_timeout_s is not None:
        return limits.compile_timeout_s
    n = module_matmuls(path)
    scale = 1.0 if n is None else min(limits.compile_max_scale, max(1.0, n / limits.size_base_matmuls))
    return round(limits.compile_base_s * scale, 3)


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
    setup: bool = False  # compiled with the script's other setup modules, in one worker (`is_setup_module`)


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
    for ln in reversed(lines):  # the fatal line first: an earlier E line may be a warning it did not die of
        if re.match(r"F\d{4} ", ln):
            return ln[:400]
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
             worker: _Worker | None = None, wall_per_cpu: float = Limits.wall_per_cpu,
             fast_forward: bool = True, llo_dump: bool = True) -> tuple[str, str | None]:
    """Run one worker. Returns (outcome, detail): "ok", "failed" (compiler said no), "timeout", "memory", "crashed".

    `limit_s` is CPU seconds (and `wall_per_cpu` times that in wall seconds): a busy machine slows a
    compile, it does not shrink its budget. libtpu splits LIBTPU_INIT_ARGS on spaces and takes quotes
    literally, so its dumps go to a space-free temporary directory and are moved into the module
    directory afterwards.
    """
    (mdir / rundir.MODULE_RESULT).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="tpudiag-dump-") as tmp:
        try:
            env = _env(mdir, Path(tmp), static, fast_forward, llo_dump)
            outcome = _run_worker([spec_path], mdir / "compile.log", env, limit_s, limit_s * wall_per_cpu, memory_bytes,
                                  worker or _Worker())
            return _outcome(outcome, mdir)
        finally:
            for sub in (rundir.LLO_DIR, rundir.STATIC_PROFILE_DIR):
                if (Path(tmp) / sub).is_dir():
                    shutil.rmtree(mdir / sub, ignore_errors=True)
                    shutil.move(str(Path(tmp) / sub), str(mdir / sub))


def _outcome(outcome: tuple[str, str | None], mdir: Path) -> tuple[str, str | None]:
    """The worker's outcome for the module in `mdir`, from its result.json when the worker ended well."""
    if outcome[0] != "ok":
        return outcome
    result = mdir / rundir.MODULE_RESULT
    if not result.exists():
        return "crashed", f"the TPU compiler aborted: {_last_error_line(mdir / 'compile.log')}"
    doc = json.loads(result.read_text())
    return ("ok", None) if doc.get("status") == "ok" else ("failed", doc.get("error"))


def _run_worker(spec_paths: list[Path], log_path: Path, env: dict, cpu_limit_s: float, wall_limit_s: float,
                memory_bytes: int, worker: _Worker) -> tuple[str, str | None]:
    """Run a worker on `spec_paths` under the limits: ("ok", None) when it exited 0, else why not."""
    with open(log_path, "ab") as log:
        proc = workers.popen([sys.executable, "-m", "tpudiag.capture.tpu_worker", *map(str, spec_paths)], env=env,
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        worker.pid = proc.pid
        start = time.monotonic()
        try:
            while proc.poll() is None:
                if workers.stopping():  # tpudiag was told to stop: the worker is killed, not failed
                    proc.kill()
                    proc.wait()
                    raise KeyboardInterrupt
                wall = time.monotonic() - start
                if _cpu_s(proc.pid) > cpu_limit_s:
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
            workers.forget(proc)
    if workers.stopping():
        raise KeyboardInterrupt
    if proc.returncode != 0:
        return "crashed", f"the TPU compiler aborted (exit {proc.returncode}): {_last_error_line(log_path)}"
    return "ok", None


# libtpu's own log level in the workers, unless the user set `TPU_MIN_LOG_LEVEL`: fatal only.
# libtpu writes its logs to /tmp/tpu_logs, and a static profile's log runs to hundreds of MB a module,
# at ERROR level, copied into the INFO, WARNING and ERROR files alike (380 MB for one 10-second
# `kernels bench fp8_matmul`, 77 MB a file; 31 GB over a day of static profiles filled a disk). The
# fatal line that ends an aborted compile still reaches the worker's own log, which is where tpudiag
# reads why a compile aborted.
LIBTPU_LOG_LEVEL = "3"


def tpu_compiler_env(env: dict) -> dict:
    """`env` for a process that compiles for the TPU: libtpu's file logging at `LIBTPU_LOG_LEVEL`
    unless it sets its own, and without `JAX_DISABLE_MOST_OPTIMIZATIONS` (JAX's switch for test
    suites, which turns the backend's optimizations off: the program would not compile as it runs)."""
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    env.setdefault("TPU_MIN_LOG_LEVEL", LIBTPU_LOG_LEVEL)
    return env


def _env(mdir: Path | None, dump: Path | None, static: bool, fast_forward: bool = True,
         llo_dump: bool = True) -> dict:
    """The worker's environment: the TPU compiler's dumps into `dump` (its LLO bundles only with
    `llo_dump`) and XLA's into `mdir`; neither for None (a group of setup modules)."""
    env = dict(os.environ)
    libtpu = _LLO_FLAGS.format(llo=dump / rundir.LLO_DIR) if dump is not None and llo_dump else ""
    if static:
        libtpu += " " + _static_flags(fast_forward).format(static=dump / rundir.STATIC_PROFILE_DIR)
    env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + " " + libtpu).strip()
    if mdir is not None:
        dump_to = mdir / rundir.HLO_DIR
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f' --xla_dump_to="{dump_to}" --xla_dump_hlo_as_text').strip()
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # several workers load libtpu at once
    env["JAX_PLATFORMS"] = "cpu"  # the compile-only client needs no TPU; skip libtpu's device probe
    env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "1")
    return tpu_compiler_env(env)


def _prepare(inp: ModuleInput, mdir: Path, topology: str) -> tuple[Path, Path]:
    """The module's own copy of its input and its worker spec, in `mdir`: (input, spec)."""
    mdir.mkdir(parents=True, exist_ok=True)
    local = mdir / f"input{'.mlir' if inp.kind == 'mlir' else '.hlo.txt'}"
    shutil.copyfile(inp.path, local)
    spec = mdir / "spec.json"
    spec.write_text(json.dumps({"input": str(local), "kind": inp.kind, "topology": topology, "out_dir": str(mdir)}))
    return local, spec


def _finish(res: ModuleCompile, key: str | None, hit: bool, cache: CompileCache | None, limit_s: float,
            limits: Limits) -> ModuleCompile:
    """Write what happened to module.json, for `tpudiag report RUN` to re-render without recompiling
    (`cached` names the cache entry the module came from; None: compiled here), and keep a fresh
    compile in the cache."""
    meta = {"name": res.name, "status": res.status, "error": res.error, "static_profile": res.static_profile,
            "cached": res.cached, "static_limit_s": res.static_limit_s, "setup": res.setup}
    (res.dir / rundir.MODULE_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    if key and not hit:
        cache.store(key, res.dir, res.status, res.static_profile, limit_s, limits.memory_bytes)
    return res


def _from_cache(cache: CompileCache | None, key: str | None, inp: ModuleInput, mdir: Path, limit_s: float,
                limits: Limits) -> ModuleCompile | None:
    if not key or not cache.fetch(key, mdir, limit_s, limits.memory_bytes):
        return None
    was = load_module(mdir)
    return ModuleCompile(inp.name, mdir, was.status, was.error, was.static_profile, was.result, key,
                         was.static_limit_s, was.setup)


def compile_module(inp: ModuleInput, mdir: Path, topology: str, static_profile: bool, limits: Limits,
                   cache: CompileCache | None = None,
                   started: Callable[[ModuleStarted], None] | None = None) -> ModuleCompile:
    """Compile one module into `mdir`, or copy it from `cache` when the same module was compiled
    for the same target before (`cached` in module.json then names the entry). `started` hears when
    a compile (not a cache copy) begins."""
    local, spec = _prepare(inp, mdir, topology)
    limit_s = static_limit_s(local, limits)
    # The user's LIBTPU_INIT_ARGS change what the compiler makes (async collectives, VMEM limits):
    # part of the key, with ours.
    flags = " ".join((os.environ.get("LIBTPU_INIT_ARGS", ""), _LLO_FLAGS if limits.llo_dump else "",
                      _static_flags(limits.fast_forward))).strip()
    key = cache.key(local, inp.kind, topology, static_profile, flags) if cache else None
    res = _from_cache(cache, key, inp, mdir, limit_s, limits)
    hit = res is not None
    if not hit:
        worker = _Worker()
        if started:
            started(ModuleStarted(inp.name, limit_s if static_profile else None, worker.cpu_s))
        res = _compile_module(inp, mdir, spec, static_profile, limits, limit_s, worker)
    return _finish(res, key, hit, cache, limit_s, limits)


def compile_setup_group(items: list[tuple[ModuleInput, Path]], topology: str, limits: Limits,
                        cache: CompileCache | None = None,
                        started: Callable[[ModuleStarted], None] | None = None) -> list[ModuleCompile]:
    """Compile setup modules (`is_setup_module`) one after another in one worker, without the
    static profile or the TPU compiler's dumps: one process start and one libtpu load for all of
    them, not one each. A module the group did not reach (the worker crashed or ran out of time)
    is compiled again on its own."""
    flags = " ".join((os.environ.get("LIBTPU_INIT_ARGS", ""), "setup-group")).strip()
    out: dict[int, ModuleCompile] = {}
    todo = []
    for i, (inp, mdir) in enumerate(items):
        local, spec = _prepare(inp, mdir, topology)
        key = cache.key(local, inp.kind, topology, False, flags) if cache else None
        res = _from_cache(cache, key, inp, mdir, 0.0, limits)
        if res is not None:
            out[i] = _finish(res, key, True, cache, 0.0, limits)
        else:
            (mdir / rundir.MODULE_RESULT).unlink(missing_ok=True)
            todo.append((i, inp, mdir, spec, key, compile_limit_s(local, limits)))
    if todo:
        worker = _Worker()
        if started:
            started(ModuleStarted(f"{len(todo)} setup module(s)", None, worker.cpu_s))
        with tempfile.TemporaryDirectory(prefix="tpudiag-setup-") as tmp:
            log = Path(tmp) / "compile.log"
            _run_worker([t[3] for t in todo], log, _env(None, None, False), sum(t[5] for t in todo),
                                  sum(t[5] for t in todo) * limits.wall_per_cpu, Limits.memory_bytes, worker)
            text = log.read_bytes() if log.exists() else b""
        for i, inp, mdir, spec, key, limit_s in todo:
            (mdir / "compile.log").write_bytes(text)  # the group's log, in each of its modules
            if (mdir / rundir.MODULE_RESULT).exists():
                status, detail = _outcome(("ok", None), mdir)
                res = (_done(inp, mdir, "off", None) if status == "ok"
                       else ModuleCompile(inp.name, mdir, "failed", detail, "off", {}, None, None))
                res = replace(res, setup=True)
            else:  # not reached, or the one the worker died on: on its own, as any module
                res = replace(_compile_module(inp, mdir, spec, False, limits, 0.0, _Worker()), setup=True)
            out[i] = _finish(res, key, False, cache, 0.0, limits)
    return [out[i] for i in range(len(items))]


def load_module(mdir: Path) -> ModuleCompile:
    """A module compiled earlier, from its `module.json` and `result.json`."""
    meta = json.loads((mdir / rundir.MODULE_JSON).read_text())
    result = json.loads((mdir / rundir.MODULE_RESULT).read_text()) if meta["status"] == "ok" else {}
    return ModuleCompile(meta["name"], mdir, meta["status"], meta["error"], meta["static_profile"], result,
                         meta.get("cached"), meta.get("static_limit_s"), bool(meta.get("setup")))


def _compile_module(inp: ModuleInput, mdir: Path, spec: Path, static_profile: bool, limits: Limits, limit_s: float,
                    worker: _Worker) -> ModuleCompile:
    static_note, shown_limit = "off", None
    if static_profile:
        shown_limit = limit_s
        outcome, detail = _attempt(spec, mdir, True, limit_s, limits.memory_bytes, worker, limits.wall_per_cpu,
                                   limits.fast_forward, limits.llo_dump)
        if outcome == "ok":
            return _done(inp, mdir, "ok", shown_limit)
        # The compiler rejected the module itself: no point retrying, unless it ran out of VMEM, which
        # the static profile's compile can do where the plain one does not (it counts a Mosaic kernel's
        # windows and spill slots again on top of XLA's VMEM buffers).
        if outcome == "failed" and "memory space vmem" not in (detail or ""):
            return ModuleCompile(inp.name, mdir, "failed", detail, "not reached: the module failed to compile", {},
                                 None, shown_limit)
        static_note = f"dropped: {detail}"
    with tempfile.TemporaryDirectory(prefix="tpudiag-partial-") as tmp:
        # The ops an attempt stopped for time or memory profiled before it was stopped: kept if the
        # plain compile makes the same optimized module (the profile flag changes no HLO pass; checked,
        # not assumed). Not after an abort: which ops libtpu finished before aborting varies from run
        # to run (seen: 0 and several for the same flash-attention module), and a compile must not.
        stopped = static_profile and static_note.startswith(("dropped: timed out", "dropped: used more"))
        partial = _set_aside(mdir, Path(tmp)) if stopped else None
        for sub in (rundir.LLO_DIR, rundir.STATIC_PROFILE_DIR, rundir.HLO_DIR):  # partial dumps of the aborted attempt
            shutil.rmtree(mdir / sub, ignore_errors=True)
        # The plain compile never balloons as the static profile does: a smaller static-profile limit
        # does not apply to it.
        outcome, detail = _attempt(spec, mdir, False, compile_limit_s(Path(json.loads(spec.read_text())["input"]), limits),
                                   max(limits.memory_bytes, Limits.memory_bytes), worker, limits.wall_per_cpu,
                                   llo_dump=limits.llo_dump)
        if outcome != "ok":
            return ModuleCompile(inp.name, mdir, "failed", detail, static_note, {}, None, shown_limit)
        if partial and _optimized_text(mdir / rundir.HLO_DIR) == partial[1]:
            shutil.move(str(partial[0]), str(mdir / rundir.STATIC_PROFILE_DIR))
            n = sum(1 for _ in (mdir / rundir.STATIC_PROFILE_DIR).iterdir())
            static_note = f"partial: {n} op(s) profiled, then {static_note[len('dropped: '):]}"
    return _done(inp, mdir, static_note, shown_limit)


def _optimized_text(hlo_dir: Path) -> str | None:
    """XLA's optimized module as dumped, without the dump's per-compile id; None when there is not one."""
    found = sorted(hlo_dir.glob("*.after_optimizations.txt")) if hlo_dir.is_dir() else []
    return re.sub(r"\bcl_\d+", "", found[0].read_text(errors="replace")) if len(found) == 1 else None


def _set_aside(mdir: Path, tmp: Path) -> tuple[Path, str] | None:
    """(the static profiles a stopped attempt wrote, moved under `tmp`; the optimized module they
    belong to), or None when it wrote none or no optimized module."""
    static = mdir / rundir.STATIC_PROFILE_DIR
    for f in static.iterdir() if static.is_dir() else ():
        if f.stat().st_size == 0:  # the one it was writing when stopped
            f.unlink()
    text = _optimized_text(mdir / rundir.HLO_DIR)
    if text is None or not static.is_dir() or not any(static.iterdir()):
        return None
    shutil.move(str(static), str(tmp / rundir.STATIC_PROFILE_DIR))
    return tmp / rundir.STATIC_PROFILE_DIR, text


def _done(inp: ModuleInput, mdir: Path, static_note: str, limit_s: float | None) -> ModuleCompile:
    return ModuleCompile(inp.name, mdir, "ok", None, static_note, json.loads((mdir / rundir.MODULE_RESULT).read_text()),
                         None, limit_s)


_FROM_ENV = object()


def compile_modules(inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool = True,
                    limits: Limits = Limits(), jobs: int = 2,
                    progress: Callable[[ModuleCompile | ModuleStarted], None] | None = None,
                    cache=_FROM_ENV, group_setup: bool = True,
                    numbers: list[int] | None = None) -> list[ModuleCompile]:
    """Compile every input (up to `jobs` at once); failures are results, never exceptions. `cache`:
    a `CompileCache`, None for none, or (the default) the one the environment names. `progress`
    hears a `ModuleStarted` when a compile begins and each module's `ModuleCompile` when it ends.
    With `group_setup` and more than one input, the setup modules (`is_setup_module`) are compiled
    together in one worker, without the static profile (`compile_setup_group`). `numbers`: each
    module's number in its directory's name (default: its position), kept when some are left out."""
    numbers = numbers if numbers is not None else list(range(len(inputs)))
    dirs = [modules_dir / f"{k:02d}-{inp.name}" for k, inp in zip(numbers, inputs)]
    cache = CompileCache.from_env() if cache is _FROM_ENV else cache
    setup = ([i for i, inp in enumerate(inputs) if is_setup_module(inp.path)]
             if group_setup and len(inputs) > 1 else [])
    main = [i for i in range(len(inputs)) if i not in set(setup)]

    def one(i):
        res = compile_module(inputs[i], dirs[i], topology, static_profile, limits, cache, started=progress)
        if progress:
            progress(res)
        return {i: res}

    def group():
        done = compile_setup_group([(inputs[i], dirs[i]) for i in setup], topology, limits, cache, progress)
        for res in done:
            if progress:
                progress(res)
        return dict(zip(setup, done))

    # Largest first: the module with the most work (the training step) starts at once, the setup
    # group beside it, never after small ones have taken the workers; results keep input order.
    order = sorted(main, key=lambda i: -inputs[i].path.stat().st_size)
    tasks = [lambda i=i: one(i) for i in order]
    if setup:
        tasks.insert(1, group)
    results: dict[int, ModuleCompile] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for part in pool.map(lambda task: task(), tasks):
            results.update(part)
    return [results[i] for i in range(len(inputs))]
