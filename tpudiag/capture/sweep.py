"""The sweep engine: many lowered modules compiled for one TPU target, each an independent task, on
this machine's processes or on a Ray cluster. `kernels tune` runs its points through it.

A task is one `tpu_compile.compile_module` call: the module's compile in its own worker process,
through the compile cache (a point compiled before for the same target and flags is copied, not
compiled), with the static-profile limits of `Limits`. Failures are results, never exceptions: a
module that crashes the compiler, runs out of VMEM or time is a `ModuleCompile` with status
"failed", and the sweep goes on.

- `LocalRunner(jobs)`: `jobs` compiles at once on this machine (threads, each waiting on its worker
  process). Default: one per two cores, at least one (a compile uses about two).
- `RayRunner(address)`: one Ray task per module (`ray.init(address=...)`: "auto" for the cluster
  `ray start --head` started on this machine, or HOST:PORT). The task gets the module's bytes, compiles
  it in a temporary directory on whichever node runs it, and returns that directory as a tar archive,
  unpacked here into the run's module directory as soon as it arrives: a node that dies loses only
  the tasks it was running (Ray retries them), never one already returned.

Both stream: `progress` hears a `ModuleStarted` when a compile is handed out and the `ModuleCompile`
when it is back. Ctrl-C cancels what has not finished (local: the queued compiles are dropped and the
running workers get the terminal's SIGINT; Ray: `ray.cancel(force=True)` on every outstanding task)
and the KeyboardInterrupt goes on up.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import tarfile
import tempfile
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

from tpudiag.capture.tpu_compile import Limits, ModuleCompile, ModuleInput, ModuleStarted, compile_module, load_module
from tpudiag.errors import InputError, one_line

Progress = Callable[[ModuleCompile | ModuleStarted], None]

# Environment a compile depends on, sent with each Ray task (the node's own environment is not ours).
_TASK_ENV = ("LIBTPU_INIT_ARGS", "TPUDIAG_CACHE_DIR", "TPUDIAG_NO_CACHE", "ALLOW_MULTIPLE_LIBTPU_LOAD")
# Seconds to wait for a HOST:PORT Ray address to accept a connection before calling it dead (Ray's
# own client retries for much longer without a word).
RAY_CONNECT_TIMEOUT_S = 5.0


def default_jobs() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


def module_dirs(inputs: list[ModuleInput], modules_dir: Path) -> list[Path]:
    """Where each module's artifacts go: `NN-name`, as every compile run names them."""
    return [modules_dir / f"{k:02d}-{inp.name}" for k, inp in enumerate(inputs)]


class LocalRunner:
    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or default_jobs()

    @property
    def description(self) -> str:
        return f"local ({self.jobs} process{'es' if self.jobs > 1 else ''})"

    def compile(self, inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool,
                limits: Limits, progress: Progress | None = None, cache=None) -> list[ModuleCompile]:
        dirs = module_dirs(inputs, modules_dir)
        results: dict[int, ModuleCompile] = {}
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        futures = {pool.submit(compile_module, inp, d, topology, static_profile, limits, cache, progress): i
                   for i, (inp, d) in enumerate(zip(inputs, dirs))}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    results[futures[f]] = res = f.result()
                    if progress:
                        progress(res)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return [results[i] for i in range(len(inputs))]


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


def _compile_task(name: str, kind: str, data: bytes, topology: str, static_profile: bool, limits: Limits,
                  env: dict) -> bytes:
    """On a Ray node: compile one module in a temporary directory; return it as a tar archive."""
    os.environ.update(env)
    from tpudiag.capture.compile_cache import CompileCache

    with tempfile.TemporaryDirectory(prefix="tpudiag-ray-") as tmp:
        src = Path(tmp) / ("input.mlir" if kind == "mlir" else "input.hlo.txt")
        src.write_bytes(data)
        mdir = Path(tmp) / "module"
        compile_module(ModuleInput(name=name, path=src, kind=kind), mdir, topology, static_profile, limits,
                       CompileCache.from_env())
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(mdir, arcname=".")
        return buf.getvalue()


def _unpack(archive: bytes, mdir: Path) -> None:
    mdir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        if sys.version_info >= (3, 12) or hasattr(tarfile, "data_filter"):
            tar.extractall(mdir, filter="data")
        else:  # pragma: no cover - Pythons without extraction filters
            tar.extractall(mdir)


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
            with contextlib.redirect_stdout(sys.stderr):  # as in compile: stdout is the document's
                ray.init(address=address, logging_level="ERROR", log_to_driver=False, ignore_reinit_error=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise InputError(f"--ray {address}: could not join the Ray cluster ({one_line(e, 200)}); start one with "
                             "`ray start --head` or give its address") from None
        self.nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        self._task = ray.remote(max_retries=3)(_compile_task)

    @property
    def description(self) -> str:
        return f"ray ({self.address}, {self.nodes} node{'s' if self.nodes != 1 else ''})"

    def compile(self, inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool,
                limits: Limits, progress: Progress | None = None, cache=None) -> list[ModuleCompile]:
        # Ray's driver prints what its cluster reports (a worker that died: "(raylet) A worker died
        # or was killed ...") on sys.stdout, where --json writes the document: it goes to stderr,
        # and the connection is closed before the document is written, so nothing comes later.
        with contextlib.redirect_stdout(sys.stderr):
            try:
                return self._compile(inputs, modules_dir, topology, static_profile=static_profile, limits=limits,
                                     progress=progress)
            finally:
                import ray

                ray.shutdown()

    def _compile(self, inputs: list[ModuleInput], modules_dir: Path, topology: str, *, static_profile: bool,
                 limits: Limits, progress: Progress | None) -> list[ModuleCompile]:
        import ray

        # each node uses the compile cache its environment names (sent with the task)
        env = {k: os.environ[k] for k in _TASK_ENV if k in os.environ}
        dirs = module_dirs(inputs, modules_dir)
        refs = {}
        for i, inp in enumerate(inputs):
            refs[self._task.remote(inp.name, inp.kind, Path(inp.path).read_bytes(), topology, static_profile,
                                   limits, env)] = i
            if progress:
                progress(ModuleStarted(inp.name, None, lambda: 0.0))  # its CPU time is the node's
        results: dict[int, ModuleCompile] = {}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = refs[ref]
                    try:
                        _unpack(ray.get(ref), dirs[i])
                        res = load_module(dirs[i])
                    except Exception as e:  # the task itself died (a node lost past its retries)
                        dirs[i].mkdir(parents=True, exist_ok=True)
                        res = ModuleCompile(inputs[i].name, dirs[i], "failed", f"Ray task failed: {one_line(e, 300)}",
                                            "not reached", {}, None, None)
                    results[i] = res
                    if progress:
                        progress(res)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return [results[i] for i in range(len(inputs))]


def runner_for(ray_address: str | None, jobs: int | None):
    """The runner the command line asked for: Ray with an address, else this machine's processes."""
    return RayRunner(ray_address) if ray_address else LocalRunner(jobs)
