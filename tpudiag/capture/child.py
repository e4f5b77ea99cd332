"""The bootstrap that runs inside the profiled child process.

`python -m tpudiag.capture.child SPEC.json` reads the spec written by `process.py`, registers
jax.monitoring listeners, starts the profiler (for the whole run, or only for the selected
`StepTraceAnnotation` steps), then runs the user's script as `__main__` with its own `sys.argv`
and `sys.path[0]`. Whatever happens to the program, it stops the profiler so the trace is
written, records how the program ended in `capture/child.json`, prints the *program's*
traceback (not ours) and exits with the program's own exit code.

The dump flags (XLA_FLAGS, JAX_DUMP_IR_TO) are already in this process's environment, set by
the parent, so they are in force when jax first loads here.
"""

from __future__ import annotations

import signal

# A stop that comes while this bootstrap still imports (before `main` can act on it) is only noted
# here, first thing, then acted on by `main`: Python's own Ctrl-C handler printed a traceback of the
# bootstrap's imports. (Until this line runs, a Ctrl-C still meets Python's default.)
_EARLY_STOPS: list[int] = []
for _s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_s, lambda signum, _frame: _EARLY_STOPS.append(signum))

import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from tpudiag.parent_death import die_with_parent  # noqa: E402
from tpudiag.errors import one_line  # noqa: E402


class _Recorder:
    """Appends one JSON line per jax.monitoring event; `end_ns` is wall-clock (epoch) time."""

    def __init__(self, path: Path):
        self._f = open(path, "a", buffering=1)

    def duration(self, event: str, duration_secs: float, **kwargs) -> None:
        self._write({"event": event, "duration_s": float(duration_secs), "end_ns": time.time_ns(),
                     **{k: str(v) for k, v in kwargs.items()}})

    def plain(self, event: str, **kwargs) -> None:
        self._write({"event": event, "end_ns": time.time_ns(), **{k: str(v) for k, v in kwargs.items()}})

    def _write(self, row: dict) -> None:
        try:
            self._f.write(json.dumps(row) + "\n")
        except ValueError:  # file closed at interpreter exit
            pass


class _Tracer:
    """Starts and stops jax's profiler once; remembers whether it ran."""

    def __init__(self, log_dir: str, python_trace: bool):
        from jax._src import profiler

        self.log_dir, self.python_trace = log_dir, python_trace
        self.started = self.stopped = False
        self.start_ns = self.stop_ns = None
        self._start, self._stop = profiler.start_trace, profiler.stop_trace
        # Only one profiler session may run: while ours runs, the program's own
        # jax.profiler.trace/start_trace/stop_trace become no-ops instead of raising.
        profiler.start_trace = self._program_start
        profiler.stop_trace = self._program_stop
        import jax.profiler

        jax.profiler.start_trace, jax.profiler.stop_trace = self._program_start, self._program_stop

    def _program_start(self, *args, **kwargs) -> None:
        if self.started and not self.stopped:
            sys.stderr.write("tpudiag: the program's own jax.profiler trace is ignored (tpudiag is tracing)\n")
            return
        self._start(*args, **kwargs)

    def _program_stop(self) -> None:
        if self.started and not self.stopped:
            return
        self._stop()

    def start_at_backend_init(self) -> None:
        """Start when the program first initializes a jax backend, not before.

        Programs often set XLA_FLAGS (e.g. --xla_force_host_platform_device_count) at their top,
        before their first jax computation; starting the profiler initializes the backends, so
        starting it any earlier would silently drop those flags. No compile or execution can
        happen before a backend exists, so nothing of interest is missed.
        """
        from jax._src import xla_bridge

        original = xla_bridge.backends

        def backends():
            result = original()
            if not self.started:
                xla_bridge.backends = original  # once is enough; also avoids re-entry from start()
                self.start()
            return result

        xla_bridge.backends = backends

    def start(self) -> None:
        if self.started:
            return
        import jax

        opts = jax.profiler.ProfileOptions()
        # The Python tracer records every Python call: 2-5x slower programs. Off unless asked.
        opts.python_tracer_level = 1 if self.python_trace else 0
        self._start(self.log_dir, profiler_options=opts)
        self.started, self.start_ns = True, time.time_ns()

    def stop(self) -> None:
        if self.started and not self.stopped:
            self.stopped = True
            self.stop_ns = time.time_ns()
            self._stop()


def _install_step_window(tracer: _Tracer, skip: int, steps: int) -> dict:
    """Trace only steps [skip, skip+steps) of the program's StepTraceAnnotation steps.

    Steps are counted in the order they are entered (step_num may be absent or repeat).
    We replace `jax.profiler.StepTraceAnnotation` before the script imports it.
    """
    import jax.profiler as jp

    original = jp.StepTraceAnnotation
    counter = {"entered": 0}

    class StepTraceAnnotation(original):  # noqa: D401 - same API as jax's
        def __init__(self, *args, **kwargs):
            # Start before the TraceMe is built: one built while no session runs records nothing.
            self._tpudiag_index = counter["entered"]
            counter["entered"] += 1
            if self._tpudiag_index == skip:
                tracer.start()
            super().__init__(*args, **kwargs)

        def __exit__(self, *exc):
            result = super().__exit__(*exc)
            if self._tpudiag_index == skip + steps - 1:
                tracer.stop()
            return result

    StepTraceAnnotation.__doc__ = original.__doc__
    jp.StepTraceAnnotation = StepTraceAnnotation
    return counter


def _program_traceback(exc: BaseException, script: str) -> str:
    """The traceback from the first frame in the user's script on: our bootstrap frames are noise."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    first = tb
    while first is not None and os.path.abspath(first.tb_frame.f_code.co_filename) != script:
        first = first.tb_next
    return "".join(traceback.format_exception(type(exc), exc, first or tb))


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


# The calibration loop: the machine's speed, timed before the program, between its traced steps and
# after it, so that `compare` can tell a slower program from a slower machine, and whether the
# machine kept one speed through the run (analyze/compare/drift.py; docs/compare.md#machine-drift).
#
# One thread per usable core (at most 8) runs np.sin over 64 Ki float32 values 240 times (~12 ms on
# an idle core), and a sample is the wall time until all have finished: like the program's XLA CPU
# steps, it needs every core at once, so a busy process on one of them slows it. The threads block
# while they wait (a join), never spin, so more load can only make it slower. One run per sample,
# as a step is one run: a best-of-3 picks the moment the machine was free and hides the contention
# that slows the steps (measured with two busy-loops on the 2-core host: best-of-3 read 0.87-0.97x
# while the steps took 1.04-1.72x; one run read 1.16-3.67x). Runs before tpudiag recorded
# `calibration_loop` timed a multithreaded OpenBLAS matmul (384x384, with tanh, 20 times, best of
# 3), before and after the program only: on the loaded host its spin-waiting threads made one
# run's samples range 36-286 ms, and with a busy-loop beside it the loop ran faster, not slower
# (52 ms against 300 ms without; measured).
CALIBRATION_LOOP = "sin-threads/2"
# Long enough for the scheduler's fair share: a shorter run that follows a pause is let ahead of a
# busy process for a few ms (measured with 2 busy-loops: 120 iterations read 1.6-4x the quiet time
# from one try to the next, 600 read 1.9-2.2x).
CALIBRATION_ITERATIONS = 240
CALIBRATION_MAX_THREADS = 8  # enough to feel a busy-loop on the machines compare is used on; bounded cost
# Traced steps after which a sample is taken: each of the first 16, then every 2nd up to 32, every
# 4th up to 64 and so on: about 8 samples per doubling of the step count (a 10,000-step run takes
# 90), so the last half of any run has at least 8, and the overhead stays bounded.
CALIBRATION_EVERY_STEP = 16


_CALIBRATION_INPUT: dict = {}  # the loop's input, made once per process


def _calibration_threads() -> int:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, CALIBRATION_MAX_THREADS))


def calibrate() -> float:
    """One sample of the calibration loop (CALIBRATION_LOOP): seconds until one thread per usable core
    has each taken np.sin of 64 Ki float32 values CALIBRATION_ITERATIONS times."""
    import threading

    import numpy as np

    x = _CALIBRATION_INPUT.get("x")
    if x is None:
        x = _CALIBRATION_INPUT["x"] = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)

    def work():
        y = np.empty_like(x)
        for _ in range(CALIBRATION_ITERATIONS):
            np.sin(x, out=y)  # releases the GIL: the threads run on separate cores

    threads = [threading.Thread(target=work, daemon=True) for _ in range(_calibration_threads())]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return round(time.perf_counter() - t, 6)


def _calibration_due(traced_steps: int) -> bool:
    """Whether to sample after the `traced_steps`-th traced step (1-based); see CALIBRATION_EVERY_STEP."""
    i = traced_steps - 1
    if i < CALIBRATION_EVERY_STEP:
        return True
    return i % (1 << (i.bit_length() - CALIBRATION_EVERY_STEP.bit_length() + 1)) == 0


def _install_step_calibration(tracer: _Tracer, samples: list[float]) -> None:
    """Sample the calibration loop after traced steps (on CALIBRATION_EVERY_STEP's schedule): between
    steps, so that no step's own duration includes it, and only while the trace runs (every step of
    a whole-run trace; the window's steps of `--steps N`). Wraps whatever `StepTraceAnnotation` is
    installed by then (the step window's, or jax's)."""
    import jax.profiler as jp

    inner = jp.StepTraceAnnotation
    traced = {"exited": 0}

    class StepTraceAnnotation(inner):  # noqa: D401 - same API as jax's
        def __exit__(self, *exc):
            was_tracing = tracer.started and not tracer.stopped
            result = super().__exit__(*exc)
            if was_tracing and exc[0] is None:
                traced["exited"] += 1
                if _calibration_due(traced["exited"]):
                    try:
                        samples.append(calibrate())
                    except Exception:  # noqa: BLE001 - a failed sample must not fail the program
                        pass
            return result

    StepTraceAnnotation.__doc__ = inner.__doc__
    jp.StepTraceAnnotation = StepTraceAnnotation


_JOINED: list[int] = []  # when the program called jax.distributed.initialize (profile --processes)


def _join_cluster(distributed: dict) -> None:
    """One process of `profile --processes N`: `jax.distributed.initialize()` called with no
    arguments (as on a pod, where the cluster supplies them) gets the coordinator's address, the
    process count and this process's id from tpudiag; arguments the program passes itself win.
    CPU collectives between processes go through gloo (jax's default on CPU is none)."""
    import jax
    import jax.distributed as jd
    from jax._src import distributed as jsd

    if distributed.get("single"):
        def alone(*_args, **_kwargs):
            """This process is the whole job: every device is local (tpudiag compile's run of a pod program)."""
            _JOINED.append(time.time_ns())

        jsd.initialize = jd.initialize = jax.distributed.initialize = alone
        return
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError, KeyError):  # an option a future jax renames: its own default
        pass
    original = jsd.initialize

    def initialize(coordinator_address=None, num_processes=None, process_id=None, *args, **kwargs):
        if kwargs.get("cluster_detection_method") is None and not args:
            kwargs["cluster_detection_method"] = "deactivate"  # no SLURM/MPI/GCE probing: tpudiag is the cluster
        _JOINED.append(time.time_ns())
        return original(coordinator_address or distributed["coordinator"],
                        distributed["num_processes"] if num_processes is None else num_processes,
                        distributed["process_id"] if process_id is None else process_id, *args, **kwargs)

    initialize.__doc__ = original.__doc__
    jsd.initialize = jd.initialize = jax.distributed.initialize = initialize


# `status`: capture/child.json, set while the bootstrap sets up (importing jax, starting the
# profiler); None once the program starts.
_PROGRAM = {"running": True, "late_signal": None, "stop": None, "status": None}


def _stop_program(signum: int, _frame) -> None:
    """While the program runs: SIGINT raises KeyboardInterrupt in it, SIGTERM exits it (code 143).
    After it has ended (tpudiag then writes the trace), the signal is only noted. Before it started
    (jax still importing), the bootstrap records the stop and leaves at once, without a traceback
    of its own."""
    if _PROGRAM["status"] is not None:
        code = 130 if signum == signal.SIGINT else 128 + signal.SIGTERM
        why = "interrupted (SIGINT / Ctrl-C)" if signum == signal.SIGINT else "terminated (SIGTERM)"
        _PROGRAM["status"].write_text(json.dumps({"exit_code": code, "reason": f"{why} before the program started",
                                                  "exception": None}, indent=2, sort_keys=True) + "\n")
        os._exit(code)
    if not _PROGRAM["running"]:
        _PROGRAM["late_signal"] = signum
        return
    _PROGRAM["stop"] = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(128 + signal.SIGTERM)


def _redeliver_dropped_stop(unraisable) -> None:
    """A stop raised inside a gc callback (jax's `_xla_gc_callback`, run during imports too) is dropped
    by Python with an "Exception ignored" traceback, and the program went on as if never stopped:
    a Ctrl-C 3 s into `tpudiag compile SCRIPT` was lost so, and the compile ran to its end. The
    signal is handled again shortly instead (`workers.redeliver`); anything else goes to the previous
    hook."""
    from tpudiag.capture.workers import redeliver

    stop = _PROGRAM["stop"]
    if stop is not None and _PROGRAM["running"] and isinstance(unraisable.exc_value, (KeyboardInterrupt, SystemExit)):
        redeliver(stop)
        return
    _redeliver_dropped_stop.previous(unraisable)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    die_with_parent(spec.get("parent_pid"))
    run = Path(spec["run_dir"])
    script = os.path.abspath(spec["script"])
    status = {"exit_code": 0, "reason": None, "exception": None}

    # SIGINT and SIGTERM stop the program (SIGTERM as an orderly exit, not a kill, so that the trace
    # is written); once the program has ended they are only noted, so that one arriving while its
    # error is formatted or its trace written cannot cut that short.
    _PROGRAM["status"] = run / "capture" / "child.json"
    signal.signal(signal.SIGTERM, _stop_program)
    signal.signal(signal.SIGINT, _stop_program)
    if _EARLY_STOPS:
        _stop_program(_EARLY_STOPS[0], None)  # leaves: the program has not started
    _redeliver_dropped_stop.previous = sys.unraisablehook
    sys.unraisablehook = _redeliver_dropped_stop

    recorder = _Recorder(run / "capture" / "monitoring.jsonl")
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(recorder.duration)
    jax.monitoring.register_event_listener(recorder.plain)

    if spec.get("distributed"):
        _join_cluster(spec["distributed"])
    tracer = _Tracer(str(run / "trace"), spec.get("python_trace", False))
    steps_seen: dict = {}
    if not spec.get("trace", True):
        pass  # a shadow run (`compile SCRIPT`): only the IR dumps are wanted
    elif spec.get("steps") is None:
        tracer.start_at_backend_init()
    else:
        steps_seen = _install_step_window(tracer, int(spec.get("skip") or 0), int(spec["steps"]))

    calibration: list[float] = []
    if spec.get("trace", True) and not spec.get("python_trace") and not spec.get("distributed"):
        # Not under the Python tracer: it would record the loop's calls between the program's steps.
        # Not in one process of `profile --processes N`: while it samples, the others wait for it at
        # their next collective, inside their next step. Those time the loop before and after only.
        _install_step_calibration(tracer, calibration)

    sys.argv = [spec["script"], *spec["args"]]
    sys.path[0] = os.path.dirname(script)
    if spec.get("trace", True):
        calibration.append(calibrate())
    t0 = time.time_ns()
    _PROGRAM["status"] = None  # the program starts: a stop now raises in it
    try:
        try:
            # runpy sets sys.argv[0] to its argument: pass the path as the user gave it (as `python x.py` would).
            runpy.run_path(spec["script"], run_name="__main__")
        finally:
            _PROGRAM["running"] = False  # first on every way out: a later SIGINT is only noted
    except SystemExit as e:
        status["exit_code"] = _exit_code(e)
        if status["exit_code"] != 0:
            status["reason"] = f"program called sys.exit({e.code!r})" if e.code != 128 + signal.SIGTERM else "terminated (SIGTERM)"
    except KeyboardInterrupt:
        status.update(exit_code=130, reason="interrupted (SIGINT / Ctrl-C)")
        sys.stderr.write("tpudiag: program interrupted; writing what was captured\n")
    except BaseException as e:  # the program's own error, including SyntaxError in the script
        sys.stderr.write(_program_traceback(e, script))
        status.update(exit_code=1, reason="program raised " + one_line(e, 285),
                      exception=type(e).__name__)
    finally:
        program_end = time.time_ns()
        try:
            sys.stdout.flush()
            tracer.stop()
            if calibration:
                calibration.append(calibrate())
        except Exception as e:  # a profiler failure must not hide the program's own result
            sys.stderr.write(f"tpudiag: stopping the profiler failed: {e}\n")
        status.update(
            program_start_ns=t0,
            program_end_ns=program_end,
            trace_started=tracer.started,
            trace_start_ns=tracer.start_ns,
            trace_stop_ns=tracer.stop_ns,
            steps_entered=steps_seen.get("entered"),
            calibration_s=calibration or None,
            calibration_loop=CALIBRATION_LOOP if calibration else None,
        )
        if spec.get("distributed"):
            status["joined_cluster"] = bool(_JOINED)
        (run / "capture" / "child.json").write_text(json.dumps(status, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if spec.get("distributed") and not spec["distributed"].get("single") and status["exit_code"] != 0:
        # jax's atexit hook (jax.distributed.shutdown) waits at a barrier for every process, up to
        # 300 s: a process that failed must leave without it, so that tpudiag sees the failure now.
        os._exit(status["exit_code"])
    sys.exit(status["exit_code"])


if __name__ == "__main__":
    main()
