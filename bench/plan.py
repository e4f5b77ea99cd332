"""`tpudiag plan` on published training configurations: where the published choice ranks among the
candidates, and the sweep's wall time on this machine's pool and on a 2-worker Ray cluster.

Each row is a configuration of bench/fidelity.py's table run through the bundled fixture
(`fixtures/programs/llama_train.py:step`, the published model and sequence, the run's compiler flags
as LIBTPU_INIT_ARGS less those the fixture does not use): `tpudiag plan` enumerates the meshes over
the row's axes (and its --search choices), estimates each candidate and ranks them. The bench prints,
per row, the ranked table, the published choice's rank and its estimated tokens/s against the best
found, and the candidates that do not fit (never ranked).

The same plan then runs on a Ray cluster started here with Ray's own `ray start --head --num-cpus 2
--block` (two worker slots on this machine: the peer of the local pool, one compile per two cores),
and the bench checks that both give the same candidate rows. Ray's scheduling overhead per task is
measured in the same run with empty tasks (a task that writes one file) through both runners:
(Ray's wall - the pool's wall) / tasks.

Never asserts; prints the table and writes `results.json` under --out.

    python bench/plan.py [--only 8b-8 8b-256] [--no-ray] [--out /tmp/bench-plan]

Needs jax >= 0.11 (libtpu 0.0.50) and the ray extra for the Ray half: pip install '.[tpu,ray]'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import NOT_FOR_FIXTURE, REFUSED, ROWS as PUBLISHED, TPUDIAG  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Each row: a published configuration (a key of fidelity.ROWS), the axes and choices plan searches,
# and the published choice among them (the mesh MaxText's `ici_fsdp_parallelism=-1` gives on the
# slice, the run's batch).
ROWS = {
    "8b-8": {"mesh_axes": "fsdp,tensor", "search": None,
             "published": {"mesh": {"fsdp": 8, "tensor": 1}, "choice": {}}},
    "8b-256": {"mesh_axes": "fsdp", "search": "batch-per-device=2,4,8",
               "published": {"mesh": {"fsdp": 256}, "choice": {"batch-per-device": 4}}},
}


def _flags(key: str) -> str:
    row = PUBLISHED[key]
    return " ".join(f for f in row["flags"] if f not in NOT_FOR_FIXTURE and f not in REFUSED)


def _args(key: str, search: str | None) -> list[str]:
    """The fixture's arguments less the options plan searches (it appends them per candidate)."""
    args = list(PUBLISHED[key]["fixture"]["args"])
    for name in (search or "").split():
        opt = "--" + name.split("=")[0]
        if opt in args:
            i = args.index(opt)
            del args[i:i + 2]
    return args


def run_plan(key: str, out: Path, ray: str | None) -> dict:
    row, pub = ROWS[key], PUBLISHED[key]
    env = dict(os.environ, LIBTPU_INIT_ARGS=_flags(key))
    env.pop("XLA_FLAGS", None)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*TPUDIAG, "plan", pub["fixture"]["entry"], "--target", pub["target"], "--mesh-axes", row["mesh_axes"],
           *(["--search", row["search"]] if row["search"] else []), *(["--ray", ray] if ray else []),
           "--json", "--out", str(out), "--", *_args(key, row["search"])]
    shown = " ".join(cmd[len(TPUDIAG):])
    print(f"$ LIBTPU_INIT_ARGS='<{len(env['LIBTPU_INIT_ARGS'].split())} flags>' "
          f"TPUDIAG_NO_CACHE=1 tpudiag {shown}", flush=True)
    env["TPUDIAG_NO_CACHE"] = "1"  # every candidate compiles: the wall time is the sweep's own
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    res = {"row": key, "runner": "ray" if ray else "local", "command": f"tpudiag {shown}", "wall_s": wall,
           "exit": proc.returncode}
    try:
        res["plan"] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        res["error"] = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:400]
    return res


def _published(key: str, plan: dict) -> dict | None:
    pub = ROWS[key]["published"]
    return next((c for c in plan["candidates"] if c["mesh"] == pub["mesh"]
                 and all(str(c["choice"].get(k)) == str(v) for k, v in pub["choice"].items())), None)


def _rows_of(plan: dict) -> list:
    """What must agree between runners: each candidate's choice, status and figures."""
    keep = ("mesh", "choice", "status", "step_s", "tokens_per_s_per_device", "mfu", "peak_hbm_bytes", "rank")
    return [{k: c.get(k) for k in keep} for c in plan["candidates"]]


def summary(res: dict) -> str:
    if "plan" not in res:
        return f"  {res['row']} ({res['runner']}): no plan: {res.get('error')}"
    plan = res["plan"]
    lines = [f"  {res['row']} ({res['runner']}, {res['wall_s']:.0f} s): {len(plan['candidates'])} candidates"]
    for c in sorted(plan["candidates"], key=lambda c: (c["rank"] is None, c["rank"] or 0)):
        mesh = ",".join(f"{a}={n}" for a, n in c["mesh"].items())
        choice = " ".join(f"{k}={v}" for k, v in c["choice"].items())
        tok = f"{c['tokens_per_s_per_device']:,.0f} tok/s/dev" if c["tokens_per_s_per_device"] else "-"
        hbm = f"{c['peak_hbm_bytes'] / 2**30:.1f} GiB" if c.get("peak_hbm_bytes") else "-"
        why = "" if c["status"] == "ok" else f"  {c['status']}: {(c.get('reason') or '')[:100]}"
        lines.append(f"    {c['rank'] or '-':>2} {mesh:24} {choice:24} {tok:>18} {hbm:>10}{why}")
    pub = _published(res["row"], plan)
    best = next((c for c in plan["candidates"] if c["rank"] == 1), None)
    if pub is None:
        lines.append("    the published choice is not among the candidates")
    elif pub["rank"] is None:
        lines.append(f"    published choice: {pub['status']} ({(pub.get('reason') or '')[:120]})")
    else:
        lines.append(f"    published choice: rank {pub['rank']} of {sum(c['rank'] is not None for c in plan['candidates'])}"
                     f", {pub['tokens_per_s_per_device'] / best['tokens_per_s_per_device']:.2f}x the best's tokens/s")
    if plan.get("reproduce"):
        lines.append(f"    reproduce: {plan['reproduce']}")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    """A one-node Ray cluster with two worker slots, started with Ray's own CLI and stopped after."""

    def __enter__(self):
        self.temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        port = _free_port()
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        self.proc = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                                      "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={self.temp}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.address = f"127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    time.sleep(3)  # the GCS listens before the raylet has registered
                    return self
            time.sleep(0.5)
        raise RuntimeError("ray start --head did not listen within 120 s")

    def __exit__(self, *exc):
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


def _empty_task(out_dir: Path) -> str:
    out_dir.mkdir(parents=True)
    (out_dir / "done").write_text("ok")
    return "ok"


def overhead(address: str, n: int, root: Path) -> dict:
    """Wall time of n empty tasks on the local pool (2 at once) and on the Ray cluster."""
    from tpudiag.capture.sweep import LocalRunner, RayRunner, Task

    walls = {}
    for name, runner in (("local", LocalRunner(2)), ("ray", RayRunner(address))):
        shutil.rmtree(root / name, ignore_errors=True)
        tasks = [Task(f"t{i}", _empty_task, (), root / name / f"t{i}") for i in range(n)]
        t0 = time.perf_counter()
        runner.run(tasks)
        walls[name] = time.perf_counter() - t0
        if hasattr(runner, "close"):
            runner.close()
    return {"tasks": n, "local_s": walls["local"], "ray_s": walls["ray"],
            "ray_overhead_per_task_s": (walls["ray"] - walls["local"]) / n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(ROWS), default=None)
    ap.add_argument("--ray-rows", nargs="*", default=["8b-8"],
                    help="rows also planned on the Ray cluster (each plan is minutes of compiles per candidate)")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-plan"))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    keys = a.only or list(ROWS)
    for key in keys:
        print(f"== {key}: {PUBLISHED[key]['what']}", flush=True)
        res = run_plan(key, a.out / f"{key}-local", None)
        results.append(res)
        print(summary(res), flush=True)
    ray_keys = [] if a.no_ray else [k for k in keys if k in a.ray_rows]
    extra = {}
    if ray_keys or not a.no_ray:
        with RayCluster() as cluster:
            print(f"== Ray cluster at {cluster.address} (ray start --head --num-cpus 2)", flush=True)
            extra["empty_tasks"] = overhead(cluster.address, 40, a.out / "empty")
            e = extra["empty_tasks"]
            print(f"  {e['tasks']} empty tasks: local pool {e['local_s']:.2f} s, Ray {e['ray_s']:.2f} s: "
                  f"{e['ray_overhead_per_task_s'] * 1e3:.0f} ms of Ray per task", flush=True)
            for key in ray_keys:
                res = run_plan(key, a.out / f"{key}-ray", cluster.address)
                results.append(res)
                print(summary(res), flush=True)
                local = next(r for r in results if r["row"] == key and r["runner"] == "local")
                if "plan" in res and "plan" in local:
                    same = _rows_of(res["plan"]) == _rows_of(local["plan"])
                    n = len(res["plan"]["candidates"])
                    print(f"  {key}: rows identical on both runners: {same}; wall local {local['wall_s']:.0f} s, "
                          f"Ray {res['wall_s']:.0f} s ({(res['wall_s'] - local['wall_s']) / n:+.1f} s per candidate)",
                          flush=True)
                    extra[f"{key}_identical"] = same
    (a.out / "results.json").write_text(json.dumps({"results": results, **extra}, indent=1))
    print(f"results: {a.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
