"""The sweep engine: many independent tasks, each filling a directory of its own, on this machine's
processes or on a Ray cluster. `kernels tune` runs its points through it (a task: one module's
compile), `plan` its candidates (a task: one whole estimate).

A task is `Task(name, fn, args, out_dir)`: `fn(out_dir, *args)` writes its artifacts under `out_dir`
(which does not exist yet) and returns a small picklable result. Failures are results: `fn` returns
what went wrong rather than raising (a compile that crashes the compiler, runs out of VMEM or time
is a "failed" module), and the sweep goes on; an exception from `fn` itself, or a Ray task lost past
its retries, is handed to `on_done` as the exception.

- `LocalRunner(jobs)`: `jobs` tasks at once on this machine (threads; each compile runs in its own
  worker process as every compile does). Default: one per two cores, at least one (a compile uses
  about two).
- `RayRunner(address)`: one Ray task per task (`ray.init(address=...)`: "auto" for the cluster
  `ray start --head` started on this machine, or HOST:PORT). It runs `fn` into a temporary directory
  on whichever node Ray picks and returns that directory as a tar archive, unpacked here into
  `out_dir` as soon as it arrives: a node that dies loses only the tasks it was running (Ray reruns
  them, up to 3 times), never one already returned. `fn` is sent by reference: tpudiag (and a
  program a task names by path) must be installed the same way on every node. The environment a
  compile depends on (`LIBTPU_INIT_ARGS`, the compile cache's settings) goes with each task.

Both stream (`on_start` hears a task handed out, `on_done` each result as it comes back) and stop on
Ctrl-C: local, the queued tasks are dropped and the running workers get the terminal's SIGINT; Ray,
`ray.cancel(force=True)` on every outstanding task. The KeyboardInterrupt goes on up.
`compile_modules` is the compile task for a list of lowered modules, on either runner.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import sys
import tarfile
import tempfile
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tpudiag.capture.tpu_compile import Limits, ModuleCompile, ModuleInput, ModuleStarted, compile_module, load_module
from tpudiag.errors import InputError, one_line

# Environment a task depends on, sent with each Ray task (the node's own environment is not ours).
_TASK_ENV = ("LIBTPU_INIT_ARGS", "TPUDIAG_CACHE_DIR", "TPUDIAG_NO_CACHE", "ALLOW_MULTIPLE_LIBTPU_LOAD", "XLA_FLAGS",
             "TPU_MIN_LOG_LEVEL")
# Seconds to wait for a HOST:PORT Ray address to accept a connection before calling it dead (Ray's
# own client retries for much longer without a word).
RAY_CONNECT_TIMEOUT_S = 5.0


def default_jobs() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class Task:
    name: str
    fn: Callable[..., Any]  # fn(out_dir, *args) -> a picklable result; a module-level function
    args: tuple
    out_dir: Path


OnDone = Callable[[int, Any], None]  # (task index, its result or the exception that ended it)


class LocalRunner:
    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or default_jobs()

    @property
    def description(self) -> str:
        return f"local ({self.jobs} at once)"

    def run(self, tasks: list[Task], on_done: OnDone | None = None,
            on_start: Callable[[int], None] | None = None) -> list[Any]:
        def call(i: int):
            if on_start:
                on_start(i)
            return tasks[i].fn(tasks[i].out_dir, *tasks[i].args)

        results: dict[int, Any] = {}
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        futures = {pool.submit(call, i): i for i in range(len(tasks))}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    i = futures[f]
                    results[i] = f.result() if f.exception() is None else f.exception()
                    if isinstance(results[i], KeyboardInterrupt):
                        raise results[i]
                    if on_done:
                        on_done(i, results[i])
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return [results[i] for i in range(len(tasks))]


def _check_reachable(address: str) -> None:
    """A HOST:PORT address must accept a TCP connection within RAY_CONNECT_TIMEOUT_S."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray {address}: expected auto or HOST:PORT (the address `ray start --head` prints)")
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise InputError(f"--ray {address}: no Ray cluster answers there ({e.strerror or one_line(e)}); start one "
                         "with `ray start --head` or give its address") from None


def _on_node(fn, args: tuple, env: dict) -> tuple[Any, bytes]:
    """On a Ray node: run fn into a temporary directory; (its result, the directory as a tar archive)."""
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="tpudiag-ray-") as tmp:
        out = Path(tmp) / "out"
        result = fn(out, *args)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            if out.exists():
                tar.add(out, arcname=".")
        return result, buf.getvalue()


def _unpack(archive: bytes, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # extraction filters: 3.12, and 3.11.4 on
            tar.extractall(out_dir, filter="data")
        else:  # pragma: no cover - an older 3.11
            tar.extractall(out_dir)


@contextlib.contextmanager
def _quiet_stderr():
    """Ray's C++ client logs each failed attempt to reach a cluster on file descriptor 2 (twenty lines
    of "Failed to get cluster ID from GCS server" before it gives up on a port that answers but is
    not Ray); the refusal is one line of ours. Descriptor 2 goes to a scratch file while Ray connects."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class RayRunner:
    def __init__(self, address: str):
        try:
            import ray
        except ImportError:
            raise InputError("--ray: the ray package is not importable here; pip install 'tpudiag[ray]'") from None
        if address != "auto":
            _check_reachable(address)
        self.address = address
        try:
            with contextlib.redirect_stdout(sys.stderr), _quiet_stderr():  # stdout is the document's (see run)
                ray.init(address=address, logging_level="ERROR", log_to_driver=False, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise InputError(f"--ray {address}: could not join the Ray cluster ({one_line(e, 200)}); start one with "
                             "`ray start --head` or give its address") from None
        self.nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        self._remote = ray.remote(max_retries=3)(_on_node)

    @property
    def description(self) -> str:
        return f"ray ({self.address}, {self.nodes} node{'s' if self.nodes != 1 else ''})"

    def run(self, tasks: list[Task], on_done: OnDone | None = None,
            on_start: Callable[[int], None] | None = None) -> list[Any]:
        # Ray's driver prints what its cluster reports (a worker that died: "(raylet) A worker died
        # or was killed ...") on sys.stdout, where --json writes the document: it goes to stderr,
        # and the connection is closed before the document is written, so nothing comes later.
        with contextlib.redirect_stdout(sys.stderr):
            try:
                return self._run(tasks, on_done, on_start)
            finally:
                import ray

                ray.shutdown()

    def _run(self, tasks, on_done, on_start) -> list[Any]:
        import ray

        env = {k: os.environ[k] for k in _TASK_ENV if k in os.environ}
        refs = {}
        for i, t in enumerate(tasks):
            refs[self._remote.remote(t.fn, t.args, env)] = i
            if on_start:
                on_start(i)
        results: dict[int, Any] = {}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = refs[ref]
                    try:
                        result, archive = ray.get(ref)
                        _unpack(archive, tasks[i].out_dir)
                    except Exception as e:  # fn raised, or the task was lost past its retries
                        result = e
                    results[i] = result
                    if on_done:
                        on_done(i, result)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return [results[i] for i in range(len(tasks))]


def runner_for(ray_address: str | None, jobs: int | None):
    """The runner the command line asked for: Ray with an address, else this machine's processes."""
    return RayRunner(ray_address) if ray_address else LocalRunner(jobs)


# -- compiles as tasks --------------------------------------------------------------------------

def compile_into(mdir: Path, name: str, kind: str, data: bytes, topology: str, static_profile: bool,
                 limits: Limits) -> str:
    """A task: compile one module (its bytes) into `mdir`, through the compile cache this process's
    environment names. Returns its status ("ok" or "failed"; module.json says why)."""
    from tpudiag.capture.compile_cache import CompileCache

    with tempfile.TemporaryDirectory(prefix="tpudiag-input-") as tmp:
        src = Path(tmp) / ("input.mlir" if kind == "mlir" else "input.hlo.txt")
        src.write_bytes(data)
        return compile_module(ModuleInput(name=name, path=src, kind=kind), mdir, topology, static_profile, limits,
                              CompileCache.from_env()).status


def compile_modules(runner, inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool,
                    limits: Limits, progress: Callable[[ModuleCompile | ModuleStarted], None] | None = None
                    ) -> list[ModuleCompile]:
    """Each lowered module compiled into `modules_dir/NN-name` (as every compile run names them) by
    `runner`; `progress` hears each start and each `ModuleCompile`."""
    dirs = [modules_dir / f"{k:02d}-{inp.name}" for k, inp in enumerate(inputs)]
    tasks = [Task(inp.name, compile_into, (inp.name, inp.kind, Path(inp.path).read_bytes(), topology, static_profile,
                                           limits), d) for inp, d in zip(inputs, dirs)]
    out: dict[int, ModuleCompile] = {}

    def done(i: int, result) -> None:
        if isinstance(result, BaseException) or not (dirs[i] / "module.json").is_file():
            shutil.rmtree(dirs[i], ignore_errors=True)
            dirs[i].mkdir(parents=True)
            why = one_line(result, 300) if isinstance(result, BaseException) else "the compile left no result"
            out[i] = ModuleCompile(inputs[i].name, dirs[i], "failed", f"task failed: {why}", "not reached", {}, None,
                                   None)
        else:
            out[i] = load_module(dirs[i])
        if progress:
            progress(out[i])

    def start(i: int) -> None:
        if progress:
            progress(ModuleStarted(inputs[i].name, None, lambda: 0.0))

    runner.run(tasks, on_done=done, on_start=start)
    return [out[i] for i in range(len(inputs))]
