"""Multi-process jobs: the cross-process report of real captured jobs (both artifact sets), held
against a naive walk of the raw traces, and `profile --processes N` run for real: a job that
succeeds, one whose process fails, one that hangs past the limit, a coordinator port that is
taken, Ctrl-C, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACT_SETS, PROGRAMS, ROOT
from tpudiag.analyze.hlo.collectives import bus_factor
from tpudiag.api.distributed import analyze_job, analyze_pod
from tpudiag.cli import cli

JOBS = [pytest.param(s, j, id=f"{s}/{j}") for s in ARTIFACT_SETS for j in ("dp_train_2p", "tp_mlp_4p", "ep_moe_4p")]
DP = [pytest.param(s, id=s) for s in ARTIFACT_SETS]


def _raw_executions(run: Path, module: str, op: str) -> dict[str, list[tuple[int, int, int]]]:
    """{run id: [(process, start, duration) per device]} of one op, read from each process's xplane
    with jaxlib's own reader (not tpudiag's parser): the oracle."""
    from jaxlib._profile_data import ProfileData

    manifest = json.loads((run / "manifest.json").read_text())
    out: dict[str, list] = {}
    for entry in manifest["processes"]:
        data = ProfileData.from_file(str(run / entry["xplane"]))
        env = next(p for p in data.planes if p.name == "Task Environment")
        t0 = int(dict(env.stats)["profile_start_time"])
        for plane in data.planes:
            if plane.name != "/host:CPU":
                continue
            for line in plane.lines:
                for e in line.events:
                    if e.name == op:
                        st = dict(e.stats)
                        if st.get("hlo_module") == module:
                            out.setdefault(str(st["run_id"]), []).append(
                                (entry["process_id"], t0 + int(e.start_ns), int(e.duration_ns)))
    return out


@pytest.mark.parametrize("set_name,job", JOBS)
def test_collective_rows_match_a_naive_walk_of_the_raw_traces(set_name, job):
    run = ARTIFACT_SETS[set_name] / job
    report = analyze_job(run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert report.num_processes == manifest["num_processes"] == len(report.processes)
    assert report.status == "ok" and report.unmatched_instances == 0
    assert report.collectives, "every fixture job runs collectives"
    for row in report.collectives:
        raw = _raw_executions(run, row.module, row.op)
        complete = {k: v for k, v in raw.items() if len(v) >= row.group_size}
        assert row.instances == len(complete)
        fastest = [min(d for _, _, d in v) for v in complete.values()]
        assert row.fastest_s == pytest.approx(np.median(fastest) * 1e-9)
        waits = sum(d - min(x for _, _, x in v) for v in complete.values() for _, _, d in v)
        assert row.wait_s == pytest.approx(waits * 1e-9)
        spreads = [max(s for _, s, _ in v) - min(s for _, s, _ in v) for v in complete.values()]
        assert row.arrival_spread_s == pytest.approx(np.median(spreads) * 1e-9)
        # nccl-tests: algbw = size / time, busbw = algbw x factor(kind, group size)
        assert row.algbw_bytes_per_s == pytest.approx(row.message_bytes / row.fastest_s)
        assert row.busbw_bytes_per_s == pytest.approx(row.algbw_bytes_per_s * bus_factor(row.kind, row.group_size))
        assert row.source and row.source.split(":")[0].endswith(f"{job.rsplit('_', 1)[0]}.py")


@pytest.mark.parametrize("set_name", DP)
def test_dp_train_names_the_planted_straggler_and_the_gradient_all_reduce(set_name):
    """Process 1 sleeps 20 ms before each step: after the first (compiling) step, process 0 waits
    about that long for it at the gradient all-reduce, every step."""
    report = analyze_job(ARTIFACT_SETS[set_name] / "dp_train_2p")
    (row,) = [r for r in report.collectives if r.module == "jit_train_step"]
    assert row.kind == "all-reduce" and row.group_size == 4 and row.instances == 4
    # w1 (256x256) + b1 (256) + w2 (256x8) and the loss, float32: the gradients and the loss the
    # one (tuple) all-reduce sums
    assert row.message_bytes == (256 * 256 + 256 + 256 * 8 + 1) * 4
    assert [s.process_id for s in report.stragglers] == [1]
    steady = [s for s in report.steps if s.step and s.step >= 1]
    assert len(steady) == 3
    for s in steady:
        assert s.last_process == 1
        assert 0.015 <= s.wait_s["p0"] <= 0.2  # 20 ms planted; a loaded machine adds, never removes
    assert report.waiting[0].waiter == 0 and report.waiting[0].waited_for == 1
    p0 = report.processes[0]
    assert p0.wait_s > report.processes[1].wait_s


def _naive_hidden(comm: list[tuple[int, int]], compute: list[tuple[int, int]]) -> int:
    """Overlap measure by brute force: every elementary interval between endpoints."""
    points = sorted({x for a, b in comm + compute for x in (a, b)})
    hidden = 0
    for a, b in zip(points, points[1:]):
        in_comm = any(s <= a and b <= e for s, e in comm)
        in_compute = any(s <= a and b <= e for s, e in compute)
        hidden += (b - a) if in_comm and in_compute else 0
    return hidden


def test_the_overlap_sweep_agrees_with_brute_force():
    from tpudiag.analyze.distributed.collectives import _overlap

    rng = np.random.default_rng(3)
    for _ in range(50):
        comm = [(int(s), int(s + d)) for s, d in zip(rng.integers(0, 1000, 6), rng.integers(1, 200, 6))]
        comp = [(int(s), int(s + d)) for s, d in zip(rng.integers(0, 1000, 9), rng.integers(1, 200, 9))]
        got = _overlap((np.array([a for a, _ in comm]), np.array([b for _, b in comm])),
                       (np.array([a for a, _ in comp]), np.array([b for _, b in comp])))
        assert got == _naive_hidden(comm, comp)


@pytest.mark.parametrize("set_name,job", JOBS)
def test_process_breakdown_is_consistent(set_name, job):
    report = analyze_job(ARTIFACT_SETS[set_name] / job)
    for p in report.processes:
        assert p.hidden_communication_s + p.exposed_communication_s == pytest.approx(p.communication_s)
        assert p.busy_s <= p.compute_s + p.communication_s + 1e-9
        assert 0 <= p.wait_s <= p.communication_s + 1e-9
        assert p.steps == 4 if job == "dp_train_2p" else p.steps == 3
    assert report.communication_s == pytest.approx(sum(p.communication_s for p in report.processes))
    assert report.alignment == "host clock"


@pytest.mark.parametrize("set_name", DP)
def test_a_pod_layout_of_the_same_traces_gives_the_same_rows(set_name, tmp_path):
    """Hosts' traces gathered as XProf lays out a pod (plugins/profile/<session>/<host>.xplane.pb),
    no HLO beside them: kinds come from op names, clocks from the first shared collective."""
    run = ARTIFACT_SETS[set_name] / "dp_train_2p"
    manifest = json.loads((run / "manifest.json").read_text())
    session = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    session.mkdir(parents=True)
    for entry, host in zip(manifest["processes"], ("t1v-n-0", "t1v-n-1")):
        shutil.copyfile(run / entry["xplane"], session / f"{host}.xplane.pb")
    pod = analyze_pod(tmp_path)
    job = analyze_job(run)
    assert pod.alignment == "first shared collective"
    assert [p.host for p in pod.processes] == ["t1v-n-0", "t1v-n-1"]
    rows = {(r.module, r.op): r for r in job.collectives}
    for r in pod.collectives:
        same = rows[(r.module, r.op)]
        assert r.kind == same.kind and r.instances == same.instances
        assert r.fastest_s == pytest.approx(same.fastest_s)
        assert r.message_bytes is None and r.source is None
    # One machine's clock: aligning on the first collective's end moves a process by less than
    # that collective took.
    longest = max(r.duration_s for r in job.collectives)
    assert abs(pod.processes[1].offset_s) < longest
    assert any("no HLO dump" in w for w in pod.warnings)
    res = CliRunner().invoke(cli, ["report", "--json", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["schema"] == "tpudiag.distributed/1"
    res = CliRunner().invoke(cli, ["report", "--json", "--align", "clock", str(tmp_path)])
    assert json.loads(res.output)["alignment"] == "host clock"


@pytest.mark.parametrize("set_name", DP)
def test_report_renders_every_format(set_name, tmp_path):
    run = ARTIFACT_SETS[set_name] / "dp_train_2p"
    runner = CliRunner()
    text = runner.invoke(cli, ["report", "--no-color", "--width", "200", str(run)])
    assert text.exit_code == 0, text.output
    assert "straggler: p1" in text.output and "all-reduce" in text.output and "Skew per step" in text.output
    md = runner.invoke(cli, ["report", "--md", str(run)])
    assert md.output.startswith("## tpudiag distributed report") and "| all-reduce |" in md.output
    doc = json.loads(runner.invoke(cli, ["report", "--json", str(run)]).output)
    from tpudiag.results.distributed import DistributedReport

    assert DistributedReport.from_dict(doc).to_dict() == doc
    page = tmp_path / "job.html"
    assert runner.invoke(cli, ["report", "--html", str(page), str(run)]).exit_code == 0
    html = page.read_text()
    for lane in ("p0 /device:CPU:0", "p0 /device:CPU:1", "p1 /device:CPU:"):
        assert lane in html  # one timeline lane per process and device
    assert "<script" not in html


def test_every_report_field_is_documented():
    import dataclasses

    from tpudiag.results import distributed as dm

    doc = (ROOT / "docs" / "distributed.md").read_text()
    for cls in (dm.DistributedReport, dm.ProcessSummary, dm.CollectiveRow, dm.StepSkew, dm.Waiting, dm.Straggler):
        for f in dataclasses.fields(cls):
            if f.metadata.get("json", True):
                assert f"`{f.name}`" in doc, f"{cls.__name__}.{f.name} is not in docs/distributed.md"


# ------------------------------------------------------------------------------------ live jobs

def _tpudiag(*args, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240, **kwargs)


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_profile_processes_runs_a_job_and_reports_it(tmp_path):
    run = tmp_path / "job"
    res = _tpudiag("profile", "--processes", "2", "--devices-per-process", "2", "--json", "--out", str(run),
                   str(PROGRAMS / "dp_train.py"), "--", "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tpudiag.distributed/1" and doc["num_processes"] == 2 and doc["devices"] == 4
    m = _manifest(run)
    assert m["status"] == "ok" and m["num_processes"] == 2 and m["devices_per_process"] == 2
    assert m["coordinator"].startswith("127.0.0.1:")
    for i, p in enumerate(m["processes"]):
        assert p["process_id"] == i and p["exit_code"] == 0 and p["joined_cluster"] is True
        assert (run / p["xplane"]).is_file()
        assert _manifest(run / p["run_dir"])["process_id"] == i
    assert len(m["xplanes"]) == 2 and all((run / x).is_file() for x in m["xplanes"])
    # each process's program output reaches the terminal marked with its process
    assert "[p0] dp_train: process 0 of 2" in res.stderr and "[p1] dp_train: process 1 of 2" in res.stderr
    assert json.loads((run / "report.json").read_text()) == doc
    # a process's own run directory is an ordinary profile run
    own = CliRunner().invoke(cli, ["report", "--json", str(run / "processes" / "p1")])
    assert own.exit_code == 0 and json.loads(own.output)["schema"] == "tpudiag.report/1"


def test_a_failing_process_stops_the_job_and_keeps_the_others_traces(tmp_path):
    run = tmp_path / "job"
    res = _tpudiag("profile", "--processes", "2", "--out", str(run), str(PROGRAMS / "dp_train.py"), "--",
                   "--steps", "4", "--fail-process", "1", "--fail-step", "2")
    assert res.returncode == 3, res.stderr[-3000:]  # the failing process's own exit code
    m = _manifest(run)
    assert m["status"] == "failed" and m["exit_code"] == 3
    assert m["reason"] == "process 1 failed: program called sys.exit(3)"
    p0, p1 = m["processes"]
    assert p1["exit_code"] == 3 and not p1["stopped_by_tpudiag"]
    # Process 0 is stopped by tpudiag, unless its own all-reduce saw process 1 leave first (Gloo:
    # "Connection closed by peer"): a race between two right answers, and the job's reason is process 1's.
    assert p0["status"] == "failed"
    assert (p0["reason"].startswith("stopped by tpudiag after process 1 failed")
            or "Connection closed by peer" in p0["reason"]), p0["reason"]
    assert p0["xplane"] and (run / p0["xplane"]).is_file()  # its trace is kept
    assert p1["xplane"] and (run / p1["xplane"]).is_file()
    assert "tpudiag: process 1 failed: program called sys.exit(3); what was captured is in" in res.stderr
    ours = [line for line in res.stderr.splitlines() if not line.startswith("[p")]  # not the programs' output
    assert not any("Traceback" in line for line in ours)
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "failed" and report["collectives"]


def test_a_hung_job_is_stopped_at_the_process_timeout(tmp_path):
    run = tmp_path / "job"
    # 20 s: both processes must be tracing by then, on a loaded 2-core runner too (at 6 s one was
    # still importing jax, and a process stopped before its trace starts writes none).
    res = _tpudiag("profile", "--processes", "2", "--process-timeout", "20", "--out", str(run),
                   str(PROGRAMS / "dp_train.py"), "--", "--steps", "4", "--hang-process", "1", "--hang-step", "2")
    assert res.returncode == 124, res.stderr[-3000:]
    m = _manifest(run)
    assert m["status"] == "failed" and "--process-timeout 20 s" in m["reason"]
    for p in m["processes"]:
        assert p["stopped_by_tpudiag"] and "still running after --process-timeout 20 s" in p["reason"]
        assert p["xplane"] and (run / p["xplane"]).is_file()  # interrupted, not killed: traces written


def test_ctrl_c_stops_every_process_and_keeps_their_traces(tmp_path):
    run = tmp_path / "job"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "profile", "--processes", "2", "--out", str(run),
                             str(PROGRAMS / "dp_train.py"), "--", "--hang-process", "0", "--hang-step", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        log = run / "processes" / "p0" / "program.log"
        if log.is_file() and "hanging at step 1" in log.read_text():
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    m = _manifest(run)
    assert m["reason"] == "interrupted (Ctrl-C): every process was stopped"
    assert all(p["xplane"] for p in m["processes"])


# Each runs one computation (so that each process writes a trace), then breaks a step tpudiag takes
# after every process has ended. A process finds its run directory from the dump directory tpudiag
# gives it (RUN/processes/pI/ir).
_ONE_STEP = """
import atexit
import os
from pathlib import Path

import jax.numpy as jnp

print("sum", float((jnp.arange(8.0) * 2).sum()))
mine = Path(os.environ["JAX_DUMP_IR_TO"]).parent
"""
_AFTER_THE_PROGRAMS = [
    # A file where the job links the processes' traces into one pod session (RUN/trace/plugins/...).
    pytest.param('(mine.parents[1] / "trace" / "plugins").write_text("not a directory")', "Not a directory",
                 id="the-traces-cannot-be-linked"),
    # tpudiag's record of how the program ended, overwritten after the child wrote it (atexit runs later).
    pytest.param('atexit.register(lambda: (mine / "capture" / "child.json").write_text("{not json"))',
                 "Expecting property name", id="a-process-cannot-be-recorded"),
]


@pytest.mark.parametrize("breaks,error", _AFTER_THE_PROGRAMS)
def test_an_error_after_the_processes_ran_leaves_every_manifest_failed(breaks, error, tmp_path):
    """Every process ended well, then tpudiag's own step fails: each process's manifest ends
    `failed` with tpudiag's error (never `running` or `ok`), as does the job's."""
    script = tmp_path / "prog.py"
    script.write_text(_ONE_STEP + breaks + "\n")
    run = tmp_path / "job"
    res = _tpudiag("profile", "--processes", "2", "--out", str(run), str(script))
    assert res.returncode == 70, res.stderr[-3000:]  # an error tpudiag did not foresee
    assert "[p0] sum 56.0" in res.stdout and "[p1] sum 56.0" in res.stdout
    m = _manifest(run)
    assert m["status"] == "failed" and m["reason"].startswith("tpudiag failed: ") and error in m["reason"]
    for i in range(2):
        p = _manifest(run / "processes" / f"p{i}")
        assert (p["status"], p["reason"]) == ("failed", m["reason"])


def test_a_taken_coordinator_port_is_retried(tmp_path):
    held = socket.socket(socket.AF_INET6, socket.SOCK_STREAM) if socket.has_ipv6 else None
    try:
        held.bind(("", 0))
    except (OSError, AttributeError):  # no IPv6 here: an IPv4 wildcard bind takes the port as well
        if held is not None:
            held.close()
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.bind(("", 0))
    with held:
        held.listen()
        port = held.getsockname()[1]
        run = tmp_path / "job"
        res = _tpudiag("profile", "--processes", "2", "--coordinator-port", str(port), "--out", str(run),
                       str(PROGRAMS / "dp_train.py"), "--", "--steps", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"tpudiag: coordinator port {port} was taken; retrying with another" in res.stderr
    assert _manifest(run)["coordinator"] != f"127.0.0.1:{port}"


@pytest.mark.parametrize("args,message", [
    (["--processes", "0"], "Invalid value for '--processes'"),
    (["--devices-per-process", "2"], "--devices-per-process needs --processes"),
    (["--processes", "2", "--target", "v5e"], "--target and --processes do not go together"),
    (["--processes", "2", "missing.py"], "missing.py: no such file"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    from tpudiag.cli import main

    script = [] if any(a.endswith(".py") for a in args) else [str(PROGRAMS / "dp_train.py")]
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--out", str(tmp_path / "r"), *args, *script])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    (line,) = [x for x in err.splitlines() if "rror" in x]  # one error line (click adds its usage above)
    assert message in line
    assert "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["export", "compare", "fusions", "suggest"])
def test_commands_that_read_one_process_say_which_to_give(command, tmp_path, capsys):
    from tpudiag.cli import main

    run = str(ARTIFACT_SETS["jax-0.10"] / "dp_train_2p")
    args = {"export": [run, "--perfetto", str(tmp_path / "x.json")], "compare": [run, run]}.get(command, [run])
    with pytest.raises(SystemExit) as exit_:
        main([command, *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "2-process job" in err and "Traceback" not in err
    # suggest: `compile` runs a multi-process program as one process (`suggest SCRIPT` would not)
    assert ("processes/p0" in err) if command != "suggest" else (
        "tpudiag compile --target v5e --out RUN fixtures/programs/dp_train.py -- " in err and "tpudiag suggest RUN" in err)
    assert not (tmp_path / "x.json").exists()
