"""A held-out battery for the classes of user-facing defect (bad paths, racing run directories, a
gate that passes a crash, bad numbers, signals): each class retried with other programs, other
paths, other signals and other numbers than those it was first found with.

Classes (case ids): P paths a run prints (report/export/fusions on relative, `.`, `../`, symlinked,
spaced, copied paths and a trace given directly); C concurrent run directories; K compare (a CUR that
crashed at import or mid-run, one that is no run, BASE and CUR the same run by symlink, by its
report.json, by a copy); E plan/estimate with FILE.py:nosuch, FILE.py:, a constant, a module, a def
of the wrong arity; N numbers out of range (nan, inf, zero) on other commands and COLUMNS=90 piped;
S signals (SIGINT/SIGTERM/SIGHUP during profile, a TPU compile, a script's shadow run, kernels bench
and verify, validate, estimate; `timeout -s INT`; kill -9 and the processes left); M the minor list;
X the first run's "Next:" block, whose commands must run as printed.

Wanted: a one-line error naming the file and the problem, a non-zero exit, no traceback,
nothing half-written; a signal ends tpudiag within 5 s with 130/143 (129 for SIGHUP), the run
directory says so, and no process it started is left. Each case prints: case, command, exit,
seconds, verdict (ok or FAIL: why). Never asserts; exits 1 if a case failed.

    python bench/heldout_battery.py [--workdir DIR] [--only P,K,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures" / "programs"
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]
STOP_S = 5.0  # how long a signal may take to end tpudiag
# `profile` stopped by a signal passes it to the program, which writes its trace; tpudiag then
# analyzes what was captured and prints the report (by design: docs/run-directory.md). The program
# must end within STOP_S; tpudiag's exit is allowed the analysis too (3-8 s on the loaded 2-core host).
PROFILE_STOP_S = 20.0
ROWS: list[dict] = []

TRAIN = '''"""Held-out: three jit modules, no StepTraceAnnotation; crashes where argv says."""
import sys
if "--crash-at-import" in sys.argv:
    import nosuch_module_for_battery  # noqa: F401
import time
import jax
import jax.numpy as jnp


@jax.jit
def init(key):
    return jax.random.normal(key, (256, 256), jnp.float32)


@jax.jit
def step(w, x):
    y = jnp.tanh(x @ w)
    return w - 0.01 * (x.T @ y), jnp.sum(y * y)


@jax.jit
def evaluate(w, x):
    return jnp.max(jnp.abs(x @ w))


def main():
    w, x = init(jax.random.PRNGKey(0)), init(jax.random.PRNGKey(1))
    for i in range(4):
        with jax.profiler.StepTraceAnnotation("train", step_num=i) if "--annotate" in sys.argv else _nothing():
            w, loss = step(w, x)
            loss.block_until_ready()
        if "--crash-at-step" in sys.argv and i == 1:
            raise RuntimeError("battery: crash at step 1")
    print("eval", float(evaluate(w, x)))
    if "--sleep" in sys.argv:
        print("ready", flush=True)
        time.sleep(60)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
'''
ASKS = 'import jax.numpy as jnp\nname = input("name? ")\nprint(jnp.ones(3) * len(name))\n'
BAD_MLIR = '''module @bad {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @NoSuchTarget(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
'''


def run(args, cwd, env=None, timeout=900, stdin=None):
    t0 = time.monotonic()
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=stdin)
    return p.returncode, time.monotonic() - t0, p.stdout, p.stderr


def first_line(*texts: str) -> str:
    for text in texts:
        for ln in text.splitlines():
            if ln.strip():
                return ln.strip()[:110]
    return ""


def last_line(text: str) -> str:
    """The last line of stderr: tpudiag's verdict or error, after the program's own output."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:110] if lines else ""


def shown_line(code, out: str, err: str) -> str:
    """What a user reads first: stdout's first line, or on failure stderr's last (the one-line error)."""
    return (last_line(err) or first_line(out)) if code else first_line(out, err)


def record(case: str, cmd, code, seconds: float, line: str, problems: list[str]) -> None:
    shown = cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)
    shown = shown.replace(str(REPO) + "/", "").replace(str(Path(sys.executable).parent) + "/", "")
    ROWS.append({"case": case, "command": shown, "exit": code, "seconds": round(seconds, 1), "first_line": line,
                 "verdict": "ok" if not problems else "FAIL: " + "; ".join(problems)})
    print(f"{case:4} {str(code):>4} {seconds:6.1f}s  {ROWS[-1]['verdict'][:70]:70}  {shown[:90]}", flush=True)


def check(case, args, cwd, *, want: int | tuple = 0, one_line: bool | None = None, needle: str | None = None,
          env=None, max_s: float | None = None, stdin=None, no_new: Path | None = None,
          program_traceback: bool = False) -> tuple[str, str]:
    """Run `tpudiag args` in `cwd`: the exit code is `want`; an error is one line on stderr (one_line:
    default for a non-zero want) containing `needle`; no traceback (but the failing program's own,
    with `program_traceback`); nothing new under `no_new`."""
    before = set(no_new.iterdir()) if no_new else set()
    code, secs, out, err = run([*TPUDIAG, *args], cwd, env, stdin=stdin)
    wants = want if isinstance(want, tuple) else (want,)
    problems = [] if code in wants else [f"exit {code}, wanted {'/'.join(map(str, wants))}"]
    if (one_line if one_line is not None else want != 0) and len(err.strip().splitlines()) != 1:
        problems.append(f"{len(err.strip().splitlines())} stderr lines")
    if needle and needle not in err + out:
        problems.append(f"no {needle!r}")
    if "Traceback" in err and not program_traceback:
        problems.append("traceback")
    if max_s and secs > max_s:
        problems.append(f"{secs:.0f} s > {max_s:.0f} s")
    if no_new and (new := set(no_new.iterdir()) - before):
        problems.append(f"left {', '.join(p.name for p in new)}")
    record(case, ["tpudiag", *args], code, secs, shown_line(code, out, err), problems)
    return out, err


def manifest(run: Path) -> dict:
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def processes_naming(run: Path) -> list[str]:
    """Live processes with an argument inside `run` (workers and the program's bootstrap carry a spec
    path there; a relative one is read from the process's own working directory)."""
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            args = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = Path(os.readlink(d / "cwd"))
        except OSError:
            continue
        if d.name == str(os.getpid()):
            continue
        for a in args[1:]:
            if a and (a == str(run) or str(run) + "/" in str(cwd / a) + "/"):
                found.append(f"{d.name}: {' '.join(args)[:80]}")
                break
    return found


def orphans() -> list[str]:
    """tpudiag's own worker and bootstrap processes whose parent is gone (reparented to init)."""
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if "tpudiag.capture." in cmd and ppid == "1":
            found.append(f"{d.name} (orphan): {cmd[:80]}")
    return found


def signal_case(case, args, cwd, run: Path, sig, *, when, want_code, reason_has: str, env=None,
                shell: str | None = None, max_s: float = STOP_S, twice: bool = False,
                may_not_exist: bool = False, program_s: float | None = None) -> None:
    """Start `tpudiag args`, wait for `when()` (True: the moment), send `sig` (or run `shell`'s own
    signal: `timeout`), then: exit `want_code` within `max_s` of the signal (of the start, for
    `shell`), the manifest `failed` with a reason containing `reason_has` (or, `may_not_exist`, no
    run directory at all: estimate creates it after lowering), no process with an argument inside
    the run and no orphaned worker left, no "aborted" and no traceback. `program_s`: a profiled
    program (`program_pid` in the manifest) must have ended within this many seconds of the signal;
    tpudiag then writes what was captured and its report, which `max_s` allows for."""
    cmd = shell if shell else [*TPUDIAG, *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, shell=bool(shell), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    t0, problems = time.monotonic(), []
    while not when() and proc.poll() is None and time.monotonic() - t0 < 300:
        time.sleep(0.05)
    if proc.poll() is not None:
        problems.append("ended before the signal")
    t_sig = time.monotonic()
    if not shell and sig is not None:
        proc.send_signal(sig)
        if twice:
            time.sleep(0.2)
            proc.send_signal(sig)
    program_pid = manifest(run).get("program_pid") if program_s else None
    while program_pid and time.monotonic() - t_sig < 300:
        try:  # gone, or a zombie until tpudiag reaps it: ended either way
            if Path(f"/proc/{program_pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                break
        except (OSError, IndexError):
            break
        time.sleep(0.02)
    program_took = time.monotonic() - t_sig
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        problems.append("still running 300 s after the signal")
    took = time.monotonic() - (t0 if shell else t_sig)
    if program_s and program_took > program_s:
        problems.append(f"the program ran {program_took:.1f} s after the signal")
    code = proc.returncode
    if code != want_code:
        problems.append(f"exit {code}, wanted {want_code}")
    if took > max_s:
        problems.append(f"took {took:.1f} s")
    time.sleep(1.0)
    m = manifest(run)
    if may_not_exist and not run.exists():
        pass  # stopped before it wrote anything: nothing half-written
    elif m.get("status") != "failed" or reason_has not in (m.get("reason") or ""):
        problems.append(f"manifest {m.get('status')}: {m.get('reason')}")
    if left := processes_naming(run) + orphans():
        problems.append(f"left running: {left[0]}")
    if "aborted" in err or "Traceback" in err:
        problems.append("'aborted' or a traceback on stderr")
    shown = shell if shell else ["tpudiag", *args, f"<{signal.Signals(sig).name} {t_sig - t0:.1f}s"
                                                    f"{' x2' if twice else ''}>"]
    line = shown_line(code, out, err) if not program_s else \
        f"program ended {program_took:.1f} s after the signal; " + shown_line(code, out, err)
    record(case, shown, code, took, line, problems)


def worker_of(run: Path):
    return lambda: any("tpu_worker" in p or "estimate_worker" in p for p in processes_naming(run))


def after(seconds: float):
    t = time.monotonic() + seconds
    return lambda: time.monotonic() >= t


# ---------------------------------------------------------------- the cases


def paths(w: Path) -> None:
    run = w / "runs" / "train run"
    _, secs, _, err = run_quiet([*TPUDIAG, "profile", "--out", str(run), "progs/train.py"], w)
    xplane = next((run / "trace").glob("plugins/profile/*/*.xplane.pb"))
    session = xplane.parent
    (w / "link to run").symlink_to(run)
    shutil.copytree(run, w / "copy of run")
    copied = next((w / "copy of run" / "trace").glob("plugins/profile/*/*.xplane.pb"))
    (w / "elsewhere").mkdir()
    check("P1", ["report", "train run/trace"], run.parent)
    check("P2", ["report", "."], run)
    check("P3", ["report", "../.."], run / "trace" / "plugins")
    check("P4", ["report", "link to run/trace"], w)
    check("P5", ["report", xplane.name], session)
    check("P6", ["report", str(copied.relative_to(w))], w)
    check("P7", ["export", "./trace", "--perfetto", "../out one.json"], run)
    check("P8", ["export", f"../runs/train run/trace/plugins/profile/{session.name}/{xplane.name}", "--perfetto",
                 "two.json.gz"], w / "elsewhere")
    check("P9", ["fusions", "train run/hlo"], run.parent)
    check("P10", ["report", "train run/hlo"], run.parent, want=2, needle="train run/hlo")


def run_quiet(args, cwd):
    return run(args, cwd)


def concurrency(w: Path) -> None:
    d = w / "concurrent"
    d.mkdir()
    t0 = time.monotonic()
    procs = [subprocess.Popen([*TPUDIAG, "profile", "../progs/train.py"], cwd=d, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    codes = [p.wait(timeout=600) for p in procs]
    runs = sorted((d / "tpudiag-runs").iterdir())
    oks = [manifest(r).get("status") for r in runs]
    problems = [] if codes == [0] * 4 and len(runs) == 4 and oks == ["ok"] * 4 else [f"exits {codes}, runs {oks}"]
    record("C1", "4 x tpudiag profile ../progs/train.py (at once, no --out)", max(codes), time.monotonic() - t0,
           f"{len(runs)} run directories: {', '.join(r.name for r in runs)}"[:110], problems)
    t0 = time.monotonic()
    procs = [subprocess.Popen([*TPUDIAG, "profile", "--out", "same", "../progs/train.py"], cwd=d,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    refused = [e for c, e in results if c == 2]
    problems = [] if codes == [0, 2, 2] and all(len(e.strip().splitlines()) == 1 for e in refused) \
        and manifest(d / "same").get("status") == "ok" else [f"exits {codes}"]
    record("C2", "3 x tpudiag profile --out same ../progs/train.py (at once)", codes, time.monotonic() - t0,
           first_line(*(e for _, e in results)), problems)


def compare(w: Path) -> None:
    d = w / "cmp"
    d.mkdir()
    for name, extra in (("base", []), ("imp", ["--crash-at-import"]), ("mid", ["--crash-at-step"])):
        run([*TPUDIAG, "profile", "--out", name, "../progs/train.py", "--", *extra], d)
    (d / "base link").symlink_to(d / "base")
    shutil.copytree(d / "base", d / "base copy")
    check("K1", ["compare", "base", "imp"], d, want=5, needle="CUR imp is a failed run")
    check("K2", ["compare", "base", "mid"], d, want=5, needle="CUR mid is a failed run")
    check("K3", ["compare", "imp", "base"], d, want=5, needle="BASE imp is a failed run")
    check("K4", ["compare", "base", "../progs"], d, want=2, needle="../progs")
    check("K5", ["compare", "base", "base link"], d, want=2, needle="same run")
    check("K6", ["compare", "base", "base/report.json"], d, want=2, needle="same run")
    check("K7", ["compare", "base link", "base copy"], d, want=2, needle="same run")
    check("K8", ["compare", "base", "../sig/S1"], d, want=5, needle="interrupted")


def entries(w: Path) -> None:
    mlp = str(FIX / "mlp.py")
    (w / "progs" / "my mlp.py").write_text((FIX / "mlp.py").read_text())
    for case, cmd, needle in (
            ("E1", ["plan", "--target", "v5e:2x2", f"{mlp}:nosuch"], "no function 'nosuch'"),
            ("E2", ["plan", "--target", "v5e:2x2", f"{mlp}:"], "expected FILE.py:FUNC"),
            ("E3", ["plan", "--target", "v5e:2x2", f"{mlp}:LEARNING_RATE"], "not a function (float value)"),
            ("E4", ["plan", "--target", "v5e:2x2", "progs/train.py:main"], "cannot be called as main(argv, mesh)"),
            ("E5", ["plan", "--target", "v5e:2x2", "progs/my mlp.py:jax"], "jax is a module"),
            ("E6", ["plan", "--target", "v5e:2x2", f"{mlp}:BATCH"], "not a function (int value)"),
            ("E7", ["estimate", "--target", "v5e", f"{mlp}:nosuch"], "no function 'nosuch'"),
            ("E8", ["estimate", "--target", "v5e", f"{mlp}:"], "expected FILE.py:FUNC"),
            ("E9", ["estimate", "--target", "v5e", "progs/my mlp.py:LEARNING_RATE"], "not a function (float value)"),
            ("E10", ["estimate", "--target", "v5e", "../../progs/nosuch.py:step"], "no such file")):
        cwd = w / "entries" / case  # no --out: the default run directory must not be left behind
        cwd.mkdir(parents=True)
        check(case, [c.replace("progs/", "../../progs/") if c.startswith("progs/") else c for c in cmd], cwd,
              want=2, needle=needle, max_s=30, one_line=cmd[0] == "plan", no_new=cwd)


def numbers(w: Path) -> None:
    ir = str(REPO / "fixtures" / "artifacts" / "decoder" / "ir")
    parity = FIX / "parity"
    for case, cmd, needle in (
            ("N1", ["compile", "--target", "v5e", "--timeout", "nan", ir], "--timeout"),
            ("N2", ["compile", "--target", "v5e", "--static-memory", "inf", ir], "--static-memory"),
            ("N3", ["compile", "--target", "v5e", "--compile-timeout", "nan", ir], "--compile-timeout"),
            ("N4", ["kernels", "bench", "--target", "v5e", "--jobs", "0", "rmsnorm"], "--jobs"),
            ("N5", ["kernels", "bench", "--target", "v5e", "--calls", "2", "rmsnorm"], "--calls"),
            ("N6", ["profile", "--processes", "2", "--process-timeout", "nan", "progs/train.py"], "--process-timeout"),
            ("N7", ["validate", f"{parity}/refs.py:rmsnorm", f"{parity}/ports.py:rmsnorm", "--inputs",
                    "x=f32[4,64] w=f32[64]", "--k", "nan"], "--k"),
            ("N8", ["report", "--width", "10", "cmp/base"], "--width"),
            ("N9", ["compare", "--top", "0", "cmp/base", "cmp/mid"], "--top"),
            ("N10", ["compare", "--max-regression", "-1%", "cmp/base", "cmp/mid"], "--max-regression"),
            ("N11", ["profile", "--steps", "0", "progs/train.py"], "--steps")):
        check(case, cmd, w, want=2, needle=needle, no_new=w, max_s=30)
    for case, cmd in (("N12", ["report", "cmp/base"]), ("N13", ["compare", "--force", "cmp/base", "cmp/base copy"]),
                      ("N14", ["targets"]), ("N15", ["kernels", "list"])):
        code, secs, out, err = run([*TPUDIAG, *cmd], w, env={**os.environ, "COLUMNS": "90"})
        widest = max((len(ln) for ln in out.splitlines()), default=0)
        record(case, "COLUMNS=90 tpudiag " + shlex.join(cmd) + " | cat", code, secs, f"widest line {widest}",
               [] if code == 0 and widest <= 90 else [f"exit {code}, widest line {widest}"])


def signals(w: Path) -> None:
    d = w / "sig"
    d.mkdir()
    bf16 = str(FIX / "bf16_attention.py")
    parity = FIX / "parity"
    for case, sig, code, why in (("S1", signal.SIGINT, 130, "interrupted"), ("S2", signal.SIGTERM, 143, "SIGTERM"),
                                 ("S3", signal.SIGHUP, 129, "SIGHUP")):
        signal_case(case, ["profile", "--out", case, "../progs/train.py", "--", "--sleep"], d, d / case, sig,
                    when=lambda: (d / case / "program.log").exists() and "ready" in
                    (d / case / "program.log").read_text(), want_code=code, reason_has=why,
                    program_s=STOP_S, max_s=PROFILE_STOP_S)
    signal_case("S4", [], d, d / "S4", None, shell=f"timeout -s INT 5 {shlex.join(TPUDIAG)} compile --target v5e "
                f"--no-cache --out S4 {bf16}", when=lambda: True, want_code=124, reason_has="interrupted",
                max_s=5 + STOP_S)
    for case, sig, code, why in (("S5", signal.SIGINT, 130, "interrupted"), ("S6", signal.SIGHUP, 129, "SIGHUP")):
        signal_case(case, ["compile", "--target", "v5e", "--no-cache", "--out", case, bf16], d, d / case, sig,
                    when=worker_of(d / case), want_code=code, reason_has=why)
    signal_case("S7", ["kernels", "bench", "--target", "v5e", "--static", "--no-cache", "--out", "S7", "rmsnorm"],
                d, d / "S7", signal.SIGTERM, when=worker_of(d / "S7"), want_code=143, reason_has="SIGTERM")
    signal_case("S8", ["compile", "--target", "v5e", "--no-cache", "--out", "S8", bf16], d, d / "S8",
                signal.SIGINT, when=worker_of(d / "S8"), want_code=130, reason_has="interrupted", twice=True)
    signal_case("S9", ["compile", "--target", "v5e", "--no-cache", "--out", "S9", bf16], d, d / "S9",
                signal.SIGINT, when=after(3.0), want_code=130, reason_has="interrupted")
    signal_case("S10", ["estimate", "--target", "v5e", "--out", "S10", f"{FIX}/llama_train.py:step"], d, d / "S10",
                signal.SIGINT, when=after(6.0), want_code=130, reason_has="interrupted", may_not_exist=True)
    for case, cmd in (("S11", ["compile", "--target", "v5e", "--no-cache", "--out", "S11", bf16]),
                      ("S12", ["profile", "--out", "S12", "../progs/train.py", "--", "--sleep"])):
        proc = subprocess.Popen([*TPUDIAG, *cmd], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait = worker_of(d / case) if case == "S11" else \
            (lambda c=case: "ready" in ((d / c / "program.log").read_text() if (d / c / "program.log").exists() else ""))
        t0 = time.monotonic()
        while not wait() and time.monotonic() - t0 < 300 and proc.poll() is None:
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        time.sleep(2.0)
        left = processes_naming(d / case) + orphans()
        code, secs, out, err = run([*TPUDIAG, "report", case], d)
        status = manifest(d / case).get("status")
        record(case, ["tpudiag", *cmd, "<kill -9>", "; tpudiag report", case], proc.returncode,
               time.monotonic() - t0, shown_line(code, out, err),
               ([f"left running: {left[0]}"] if left else []) + ([] if status == "failed" else [f"manifest {status}"]))
    for case, cmd, sig, code, at in (
            ("S13", ["kernels", "verify", "rope"], signal.SIGTERM, 143, 3.0),
            ("S14", ["kernels", "verify", "cross_entropy"], signal.SIGINT, 130, 6.0),
            ("S15", ["validate", f"{parity}/refs.py:attention", f"{parity}/ports.py:attention", "--inputs",
                     "q=f32[2,4,256,64] k=f32[2,4,256,64] v=f32[2,4,256,64]", "--grad", "--regimes", "all",
                     "--seed", "1"], signal.SIGTERM, 143, 4.0),
            ("S16", ["validate", f"{parity}/refs.py:attention", f"{parity}/ports.py:attention", "--inputs",
                     "q=f32[2,4,256,64] k=f32[2,4,256,64] v=f32[2,4,256,64]", "--grad", "--seed", "1"],
             signal.SIGHUP, 129, 6.0)):
        proc = subprocess.Popen([*TPUDIAG, *cmd], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(at)
        t_sig = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
        took = time.monotonic() - t_sig
        problems = ([] if proc.returncode == code else [f"exit {proc.returncode}, wanted {code}"]) + \
            ([f"took {took:.1f} s"] if took > STOP_S else []) + (["traceback"] if "Traceback" in err else [])
        record(case, ["tpudiag", *cmd, f"<{signal.Signals(sig).name} {at:.0f}s>"], proc.returncode, took,
               shown_line(proc.returncode, out, err), problems)
    signal_case("S17", ["profile", "--target", "v5e", "--no-cache", "--out", "S17", bf16], d, d / "S17" / "tpu",
                signal.SIGINT, when=worker_of(d / "S17" / "tpu"), want_code=130, reason_has="interrupted")


def minor(w: Path) -> None:
    (w / "empty file").write_text("")
    check("M1", ["profile", "--out", "empty file", "progs/train.py"], w, want=2, needle="empty file")
    check("M2", ["profile", "--out", "m2", "progs/train.py", "--", "--crash-at-import"], w, want=1, one_line=False,
          needle="program raised ModuleNotFoundError", program_traceback=True)
    (w / "progs" / "asks.py").write_text(ASKS)
    import pty

    master, slave = pty.openpty()
    check("M3", ["profile", "--out", "m3", "progs/asks.py"], w, want=1, one_line=False, needle="pipe or redirect",
          stdin=slave, program_traceback=True)
    os.close(master)
    os.close(slave)
    (w / "progs" / "quiet.py").write_text('print("no jax here")\n')
    out, _ = check("M4", ["profile", "--out", "m4", "progs/quiet.py"], w, want=2, needle="nothing was traced")
    box = next((ln for ln in out.splitlines() if "status" in ln), "")
    if "nothing was traced" not in box:
        record("M4+", "the box of M4", 2, 0, box.strip()[:110], ["the box does not say nothing was traced"])
    check("M5", ["profile", "--out", "m5 with space", "progs/train.py"], w, needle="--logdir 'm5 with space/trace'")
    (w / "progs" / "bad.mlir").write_text(BAD_MLIR)
    check("M6", ["compile", "--target", "v5e", "--out", "m6", "progs/bad.mlir"], w, want=1, one_line=False,
          needle="Custom emitter for NoSuchTarget not found")
    cpu_hlo = next((REPO / "fixtures" / "artifacts" / "decoder" / "hlo").glob("*jit_stage*after_optimizations.txt"))
    check("M7", ["compile", "--target", "v5e", "--out", "m7", str(cpu_hlo)], w, want=1, one_line=False,
          needle="failed to legalize operation")


def next_block(w: Path) -> None:
    """The first run's "Next:" block: present, and each `tpudiag profile --steps` command in it that is
    complete as printed (no placeholder) runs and traces steps."""
    for case, prog in (("X1", ["progs/train.py"]), ("X2", ["progs/train.py", "--", "--annotate"]),
                       ("X3", [str(FIX / "decode_step.py")])):
        code, secs, out, err = run([*TPUDIAG, "profile", *prog], w)
        block = out[out.find("\nNext:"):] if "\nNext:" in out else ""
        problems = [] if code == 0 and block else [f"exit {code}" if code else "no Next: block"]
        for ln in block.splitlines():
            if "tpudiag profile --steps" in ln and "OPTIONS" not in ln and "wrap one" not in ln:
                cmd = shlex.split(ln[ln.index("tpudiag profile --steps"):])
                c2, s2, o2, e2 = run([*TPUDIAG, *cmd[1:]], w)
                if c2 != 0:
                    problems.append(f"its {' '.join(cmd[:5])} exits {c2}: {first_line(e2)[:60]}")
        record(case, ["tpudiag", "profile", *prog], code, secs, first_line(block[1:]) + " " +
               (block.splitlines()[2].strip()[:80] if len(block.splitlines()) > 2 else ""), problems)


CLASSES = {"P": paths, "C": concurrency, "K": compare, "E": entries, "N": numbers, "S": signals, "M": minor,
           "X": next_block}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a fresh temporary one)")
    ap.add_argument("--only", default="P,C,S,K,E,N,M,X", help="classes to run, in order (K and N read S's runs)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = ap.parse_args()
    w = (a.workdir or Path(tempfile.mkdtemp(prefix="tpudiag-battery-"))).resolve()
    w.mkdir(parents=True, exist_ok=True)
    (w / "progs").mkdir(exist_ok=True)
    (w / "progs" / "train.py").write_text(TRAIN)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    print(f"workdir {w}; tpudiag: {shlex.join(TPUDIAG)}", flush=True)
    t0 = time.monotonic()
    for c in a.only.split(","):
        CLASSES[c.strip()](w)
    failed = [r for r in ROWS if r["verdict"] != "ok"]
    print(f"\n{len(ROWS) - len(failed)} of {len(ROWS)} cases ok in {time.monotonic() - t0:.0f} s\n")
    print("| case | command | exit | s | output (stdout's first line; on failure stderr's last) | verdict |\n"
          "|---|---|---:|---:|---|---|")
    for r in ROWS:
        line = r["first_line"][:90].replace("|", "\\|").replace("`", "'")
        print(f"| {r['case']} | `{r['command'][:110]}` | {r['exit']} | {r['seconds']} | {line} | {r['verdict']} |")
    if a.json:
        a.json.write_text(json.dumps(ROWS, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
