"""`tpudiag kernels tune`: the search space, the sweep on this machine's processes and on a Ray
cluster started here (the same rows), JAX's own flash attention searched as a user would (points out
of VMEM are rows), and the bad inputs (one line, exit 2, no run directory)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import PROGRAMS, ROOT
from tpudiag.analyze.compile.tune import MAX_POINTS, parse_space, space_points
from tpudiag.errors import InputError

HAVE_RAY = importlib.util.find_spec("ray") is not None
OURS = f"{PROGRAMS}/tune_flash_attention.py:kernel"
JAXS = f"{PROGRAMS}/thirdparty/jax_flash_attention.py:kernel"
SMALL = "q=bf16[1,2,256,128] k=bf16[1,2,256,128] v=bf16[1,2,256,128]"


def _tune(*args, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "tpudiag", "kernels", "tune", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_space_is_every_combination_first_name_slowest():
    space = parse_space("block_q=128,256 block_k=64..66 layout=SEQ_MINOR,HEAD_DIM_MINOR fused=True")
    assert space == {"block_q": [128, 256], "block_k": [64, 65, 66], "layout": ["SEQ_MINOR", "HEAD_DIM_MINOR"],
                     "fused": [True]}
    points = space_points(space)
    assert len(points) == 12
    assert points[0] == {"block_q": 128, "block_k": 64, "layout": "SEQ_MINOR", "fused": True}
    assert points[1]["layout"] == "HEAD_DIM_MINOR" and points[-1]["block_q"] == 256


@pytest.mark.parametrize("text,says", [
    ("", "the search space is empty"),
    ("block_q=", "'block_q' has no values"),
    ("block_q", "is not NAME=V1,V2"),
    ("2x=1", "is not NAME=V1,V2"),
    ("a=1 a=2", "'a' is given twice"),
    ("a=1,1", "'a' lists a value twice"),
    ("a=9..3", "low end is above its high end"),
    (f"a=1..{MAX_POINTS} b=1,2", f"over the {MAX_POINTS:,} one search may compile"),
])
def test_a_bad_space_names_what_is_wrong(text, says):
    with pytest.raises(InputError, match=says):
        parse_space(text)


def test_bad_inputs_are_one_line_and_leave_nothing(tmp_path):
    out = tmp_path / "r"
    cases = [
        ((OURS, "--space", "", "--inputs", SMALL), "--space: the search space is empty"),
        ((OURS, "--space", "nope=1,2", "--inputs", SMALL), "takes no argument 'nope' from --space"),
        ((f"{PROGRAMS}/tune_flash_attention.py:kernal", "--space", "block_q=128", "--inputs", SMALL),
         "no function 'kernal'"),
        ((OURS, "--space", "block_q=128", "--inputs", "q=bf16[1,x]"), "--inputs: 'q=bf16[1,x]' is not"),
        ((OURS, "--inputs", SMALL), "--space: required for FILE.py:FUNC"),
        (("flash_attention", "--inputs", SMALL), "--inputs: flash_attention is a bundled kernel"),
        (("flash_attention", "--space", "block_z=1"), "flash_attention's block sizes have no 'block_z'"),
        (("flash_atention",), "no bundled kernel named 'flash_atention'"),
        (("flash_attention", "--reference", f"{PROGRAMS}/tune_flash_attention.py:reference"),
         "--reference: flash_attention is a bundled kernel"),
        ((OURS, "--space", "block_q=128", "--inputs", SMALL, "--reference", f"{PROGRAMS}/nope.py:f"), "nope.py"),
        ((OURS, "--space", "block_q=128", "--inputs", SMALL, "--ray", "127.0.0.1:1"),
         "no Ray cluster answers there" if HAVE_RAY else "the ray package is not importable here"),
    ]
    for args, says in cases:
        res = _tune(*args, "--target", "v5e", "--out", str(out), timeout=120)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and says in lines[0], (args, res.stderr)
        assert lines[0].startswith("tpudiag: error: ") and not out.exists()


def test_points_the_kernel_refuses_are_rows_and_none_compiling_exits_1(tmp_path):
    res = _tune(OURS, "--target", "v5e", "--space", "block_q=100,200", "--inputs", SMALL, "--out",
                str(tmp_path / "r"), "--json", timeout=120)
    assert res.returncode == 1 and "no point of the space compiled" in res.stderr, res.stderr[-2000:]
    assert json.loads(res.stdout)["status"] == "failed"
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["status"] == "failed" and doc["best"] is None
    assert [p["status"] for p in doc["points"]] == ["error", "error"]
    assert "must be a multiple of 128" in doc["points"][0]["error"]
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["status"] == "failed"


def test_jax_flash_attention_is_searched_and_blocks_past_vmem_are_rows(tmp_path, oldest_leg):
    """JAX's own kernel (not ours) at one 2048-token head: its 2048-row query blocks overflow the
    16 MiB of scoped VMEM it keeps on v5e, which the compiler refuses; the rest are ranked by their
    corrected cycles."""
    run = tmp_path / "jax"
    res = _tune(JAXS, "--target", "v5e", "--space", "block_q=256,2048 block_k_major=2048 block_k=256,2048",
                "--inputs", "q=bf16[1,1,2048,128] k=bf16[1,1,2048,128] v=bf16[1,1,2048,128]", "--out", str(run),
                "--no-cache", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tpudiag.kernels-tune/1" and doc["status"] == "ok"
    by = {(p["choice"]["block_q"], p["choice"]["block_k"]): p for p in doc["points"]}
    assert {by[(2048, k)]["status"] for k in (256, 2048)} == {"out_of_vmem"}
    assert "vmem" in by[(2048, 256)]["error"].lower()
    ok = sorted((p for p in doc["points"] if p["status"] == "ok"), key=lambda p: p["rank"])
    assert [p["rank"] for p in ok] == [1, 2] and ok[0]["corrected_cycles"] <= ok[1]["corrected_cycles"]
    assert doc["best"] == ok[0]["choice"]
    assert all(p["static_profile"] == "ok" and p["static_cycles"] for p in ok)
    # the report re-renders from the run directory, not recompiled
    again = subprocess.run([sys.executable, "-m", "tpudiag", "report", "--json", str(run)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout) == doc, again.stderr[-2000:]
    for form, says in (([], "best: block_"), (["--md"], "### tpudiag kernels tune")):
        shown = subprocess.run([sys.executable, "-m", "tpudiag", "report", *form, str(run)], cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0 and says in shown.stdout, shown.stderr[-2000:]


def test_each_point_is_checked_against_a_reference_and_one_that_differs_is_never_ranked(tmp_path):
    """--reference runs every compiled point on this CPU (interpret mode) against the reference by
    validate's rule. Against the fixture's causal reference both points match; against a non-causal
    one (a reference written for another mask) neither does, and nothing is ranked."""
    space = ("--space", "block_q=128,256 block_k=128")
    res = _tune(OURS, "--target", "v5e", *space, "--inputs", SMALL, "--reference",
                f"{PROGRAMS}/tune_flash_attention.py:reference", "--seed", "3", "--out", str(tmp_path / "ok"), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["reference"].endswith("tune_flash_attention.py:reference (seed 3)")
    assert [p["verified"] for p in doc["points"]] == ["pass", "pass"] and doc["best"] is not None
    other = tmp_path / "noncausal.py"
    other.write_text("from tpudiag.kernels.flash_attention import xla_attention\n\n\n"
                     "def reference(q, k, v):\n    return xla_attention(q, k, v, causal=False)\n")
    res = _tune(OURS, "--target", "v5e", *space, "--inputs", SMALL, "--reference", f"{other}:reference",
                "--out", str(tmp_path / "bad"), "--json")
    assert res.returncode == 1 and "no point of the space compiled and matched the reference" in res.stderr
    doc = json.loads(res.stdout)
    assert {p["status"] for p in doc["points"]} == {"mismatch"} and doc["best"] is None
    assert all(p["rank"] is None and p["corrected_cycles"] and "candidate vs float64" in p["error"]
               for p in doc["points"])


def test_the_bundled_flash_attention_tunes_to_its_own_blocks(tmp_path, newest_leg):
    """A bundled kernel by name: its block candidates at its production shape (B1 H8 S2048 D128,
    causal), each grid step stepped through by the static profile. The winner is the kernel's own
    blocks, as the block sweep found (bench/RESULTS.md); whole-sequence blocks beat 1024-row ones. The
    search again, from the compile cache the first one filled, gives the same ranking."""
    from tpudiag.kernels.flash_attention import DEFAULT_BLOCKS, SPEC

    cache = str(tmp_path / "cache")
    res = _tune("flash_attention", "--target", "v5e", "--out", str(tmp_path / "r"), "--cache-dir", cache, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["program"] == "flash_attention" and doc["inputs"].startswith("B1 H8 KVH8 S2048 D128")
    assert len(doc["points"]) == len(SPEC.block_candidates)
    own = {k: getattr(DEFAULT_BLOCKS, k) for k in doc["space"]}
    assert doc["default"] == own and doc["best"] == own
    cycles = {(p["choice"]["block_q"], p["choice"]["block_k"], p["choice"]["compute_k"]): p["corrected_cycles"]
              for p in doc["points"]}
    assert cycles[(2048, 2048, 256)] < cycles[(2048, 1024, 256)] < cycles[(1024, 1024, 256)] < cycles[(512, 512, 256)]
    assert not any(p["cached"] for p in doc["points"])
    shown = _tune("flash_attention", "--target", "v5e", "--out", str(tmp_path / "again"), "--cache-dir", cache)
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert [p["cached"] for p in again["points"]] == [True] * len(SPEC.block_candidates)
    assert [p["corrected_cycles"] for p in again["points"]] == [p["corrected_cycles"] for p in doc["points"]]
    assert shown.returncode == 0 and "the kernel's own blocks (block_q=2048 block_k=2048 compute_q=128 " \
        "compute_k=256): rank 1, 1.00x the best" in shown.stdout, shown.stdout[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_cluster():
    """A one-node Ray cluster on 127.0.0.1, started with Ray's own `ray start --head` (held in the
    foreground with --block, so stopping it stops only this cluster). Its temporary directory is a
    short one under /tmp: Ray's sockets live there, and a socket path has at most 107 characters."""
    if not HAVE_RAY:
        pytest.skip("needs the ray package (pip install '.[ray]')")
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    port = _free_port()
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        shutil.rmtree(temp, ignore_errors=True)
        pytest.fail("ray start --head did not listen within 120 s")
    yield f"127.0.0.1:{port}"
    # Every Ray process of the cluster is in the group `ray start` leads: killed at once. A graceful
    # stop (SIGTERM) takes 30-60 s on a 2-core machine, and this cluster holds nothing to keep.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    shutil.rmtree(temp, ignore_errors=True)


def _kill_one_ray_task_once_a_point_is_back(run, proc) -> bool:
    """While the sweep runs: once one point's module is back in the run, SIGKILL one Ray worker that
    is compiling another (Ray names them `ray::_on_node`). True if one was killed."""
    while proc.poll() is None:
        if (run / "modules").is_dir() and any((run / "modules").iterdir()):
            found = subprocess.run(["pgrep", "-f", "ray::_on_node"], capture_output=True, text=True).stdout.split()
            if found:
                os.kill(int(found[0]), signal.SIGKILL)
                return True
        time.sleep(0.1)
    return False


def test_the_local_pool_and_a_ray_cluster_give_the_same_rows(tmp_path, ray_cluster):
    """The same sweep on this machine's processes and on a Ray cluster, where one Ray worker is
    killed mid-compile once a point is back: Ray reruns the lost task, no finished point is lost,
    and the rows are the same."""
    args = [OURS, "--target", "v5e", "--space", "block_q=128,256 block_k=128,256", "--inputs", SMALL, "--no-cache",
            "--json"]
    local = _tune(*args, "--out", str(tmp_path / "local"), "--jobs", "2")
    assert local.returncode == 0, local.stderr[-3000:]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    with open(tmp_path / "ray.json", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "kernels", "tune", *args, "--out",
                                 str(tmp_path / "ray"), "--ray", ray_cluster], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.PIPE, text=True)
        killed = _kill_one_ray_task_once_a_point_is_back(tmp_path / "ray", proc)
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert killed, "the sweep ended before a Ray worker could be killed"
    docs = {"local": json.loads(local.stdout), "ray": json.loads((tmp_path / "ray.json").read_text())}
    rows = {how: [{k: v for k, v in p.items() if k != "module"} for p in d["points"]] for how, d in docs.items()}
    assert rows["local"] == rows["ray"]
    assert docs["ray"]["runner"].startswith("ray (127.0.0.1:") and docs["local"]["runner"] == "local (2 at once)"
    assert all(p["status"] == "ok" for p in docs["ray"]["points"])
    # each point's compiled module came back into the run directory
    assert all((tmp_path / "ray" / p["module"] / "module.json").is_file() for p in docs["ray"]["points"])


def test_a_kernel_with_nested_block_sizes_is_searched_over_its_candidates():
    # fused_moe's blocks are one grouped-matmul tiling per expert call: each candidate's choice is
    # that tiling's text, and the choices are JSON (the tune document stores them).
    import json

    from tpudiag.api.tune import _bundled_points
    from tpudiag.kernels.registry import get_spec

    space, points, _, _, _, own = _bundled_points("fused_moe", None, None)
    cands = get_spec("fused_moe").block_candidates
    assert set(space) == {"gate_up", "down"}
    assert len(points) == len(cands)
    assert points[0] == {"gate_up": str(cands[0].gate_up), "down": str(cands[0].down)}
    assert own == points[0]  # the first candidate is the kernel's default
    json.dumps({"space": space, "points": points, "own": own})


def test_a_kernel_whose_default_follows_its_shape_is_ranked_at_the_blocks_its_bench_takes():
    """mla_decode's blocks follow the page size (`default_blocks`), not its BlockSizes class's
    defaults: the search names the blocks its bench shape takes as the kernel's own, over its
    candidates and over a --space of one field."""
    from tpudiag.api.tune import _bundled_points
    from tpudiag.kernels import mla_decode

    own_blocks = mla_decode.default_blocks(mla_decode.PROD["page_size"])
    space, points, build, *_, own = _bundled_points("mla_decode", None, None)
    assert own == {f: getattr(own_blocks, f) for f in space} and own in points
    space, points, build, *_, own = _bundled_points("mla_decode", "pages_per_block=1,2", None)
    assert own == {"pages_per_block": own_blocks.pages_per_block} and len(points) == 2
