"""`tpudiag plan`: the meshes of a slice, how a candidate's choice reaches the program, a real plan of
the bundled training step on a small slice (a batch that fits is ranked, one the compiler says does
not fit is listed below it), and the bad inputs (one line, exit 2, no run directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROGRAMS, ROOT
from tpudiag.analyze.plan import candidate_argv, mesh_shapes
from tpudiag.api.plan import declared_axes, declared_remat, default_space
from tpudiag.results.plan import Plan

LLAMA = f"{PROGRAMS}/llama_train.py:step"


def _plan(*args, timeout=900) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "tpudiag", "plan", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_every_split_of_the_devices_over_the_axes():
    assert mesh_shapes(8, ["fsdp"]) == [{"fsdp": 8}]
    assert mesh_shapes(8, ["fsdp", "tensor"]) == [{"fsdp": 8, "tensor": 1}, {"fsdp": 4, "tensor": 2},
                                                  {"fsdp": 2, "tensor": 4}, {"fsdp": 1, "tensor": 8}]
    shapes = mesh_shapes(64, ["fsdp", "tensor", "sequence"])
    assert len(shapes) == 28 and all(s["fsdp"] * s["tensor"] * s["sequence"] == 64 for s in shapes)
    assert len({tuple(s.values()) for s in shapes}) == 28


def test_a_choice_reaches_the_program_as_its_own_arguments():
    assert candidate_argv(["--seq", "512"], {"remat": "full", "batch-per-device": 2}, {"fsdp": 4}, maxtext=False) == \
        ["--seq", "512", "--remat", "full", "--batch-per-device", "2"]
    assert candidate_argv(["max_target_length=8192"], {"remat_policy": "full"}, {"fsdp": 4, "tensor": 2},
                          maxtext=True) == ["max_target_length=8192", "ici_fsdp_parallelism=4",
                                            "ici_tensor_parallelism=2", "remat_policy=full"]


def test_the_bundled_step_declares_its_mesh_axes():
    assert declared_axes(PROGRAMS / "llama_train.py") == ("fsdp", "tensor")
    assert declared_axes(PROGRAMS / "mlp.py") is None


def test_a_plain_plan_searches_the_programs_own_axes_and_remat_choices():
    """No --mesh-axes: FUNC's MESH_AXES; no --search: the keys of its REMAT dict, unless its
    arguments fix one. On v5e:2x4 that is 4 meshes x 8 remat choices (MaxText's, by its names)."""
    path = PROGRAMS / "llama_train.py"
    remat = ["full", "minimal", "minimal_with_context", "save_dot_except_mlp", "save_qkv_proj", "minimal_offloaded",
             "offload", "none"]
    assert declared_remat(path) == tuple(remat)
    assert default_space(path, [], maxtext=False) == {"remat": remat}
    assert default_space(path, ["--remat", "full"], maxtext=False) == {}
    assert default_space(PROGRAMS / "mlp.py", [], maxtext=False) == {}
    assert default_space(path, [], maxtext=True)["remat_policy"][:2] == ["full", "minimal"]
    assert len(mesh_shapes(8, list(declared_axes(path)))) * len(default_space(path, [], False)["remat"]) == 32


def test_a_function_the_file_does_not_define_is_refused_at_once(tmp_path):
    out = tmp_path / "r"
    res = _plan(f"{PROGRAMS}/llama_train.py:nosuch", "--target", "v5e:2x2", "--out", str(out), timeout=120)
    assert res.returncode == 2 and "no function 'nosuch'" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


_FUNCS = """import jax
from functools import partial
LEARNING_RATE = 1e-2
BATCH, D_IN = 128, (512, "x")
NAMES: list = ["a"]
def main(): pass
def needs_kw(argv, mesh, *, extra): pass
def step(argv: "list[str]", mesh: "Mesh" = UNDEFINED_AT_DEF_TIME, *rest) -> dict: pass
@jax.jit
def jitted(x): pass
later = partial(step)
"""


@pytest.mark.parametrize("func,says", [
    ("LEARNING_RATE", "LEARNING_RATE is not a function (float value); plan calls LEARNING_RATE(argv, mesh)"),
    ("BATCH", "BATCH is not a function (int value)"),
    ("NAMES", "NAMES is not a function (list value)"),
    ("jax", "jax is a module, not a function"),
    ("main", "main() cannot be called as main(argv, mesh): too many positional arguments"),
    ("needs_kw", "needs_kw(argv, mesh, *, extra) cannot be called as needs_kw(argv, mesh): missing a required"),
    ("nosuch", "no function 'nosuch' at its module level"),
])
def test_a_func_that_cannot_be_the_step_is_refused_before_any_candidate(tmp_path, func, says):
    """FILE.py:CONSTANT, a module or a def of the wrong arity passed the old check (a name bound at
    the module level) and plan ran every candidate, each failing alike, to say "no candidate fits"
    (exit 1). Read from the file, never run: exit 2, one line, no run directory."""
    from tpudiag.api.plan import check_func
    from tpudiag.errors import InputError

    (tmp_path / "funcs.py").write_text(_FUNCS)
    with pytest.raises(InputError) as e:
        check_func(tmp_path / "funcs.py", func)
    assert str(e.value).startswith(f"{tmp_path / 'funcs.py'}: ") and says in str(e.value)
    if func == "LEARNING_RATE":  # and the command says it the same way, at once
        res = _plan(f"{tmp_path / 'funcs.py'}:{func}", "--target", "v5e:2x2", "--out", str(tmp_path / "r"),
                    timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and says in res.stderr
        assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("func", ["step", "jitted", "later", "partial"])
def test_what_only_running_the_file_can_tell_is_left_to_the_estimate_worker(tmp_path, func):
    """A def that takes (argv, mesh) (its annotations and defaults never evaluated), a decorated def,
    a computed value and an imported name pass the static check."""
    from tpudiag.api.plan import check_func

    (tmp_path / "funcs.py").write_text(_FUNCS)
    check_func(tmp_path / "funcs.py", func)


@pytest.mark.parametrize("args,says", [
    (["--mesh-axes", "fsdp,expert"], "takes no mesh axis 'expert' (it takes: fsdp, tensor)"),
    (["--mesh-axes", "fsdp,fsdp"], "an axis is given twice"),
    (["--search", ""], "--search: the search space is empty"),
    (["--search", "batch-per-device="], "'batch-per-device' has no values"),
])
def test_bad_inputs_are_one_line_and_leave_nothing(tmp_path, args, says):
    out = tmp_path / "r"
    res = _plan(LLAMA, "--target", "v5e:2x2", "--out", str(out), *args, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and says in lines[0], res.stderr
    assert not out.exists()


def test_a_batch_that_fits_is_ranked_above_one_that_does_not(tmp_path, newest_leg):
    """The bundled step at sequence 512 and a 32k vocabulary on v5e:2x2: one sequence a device
    fits; 512 a device needs more HBM than a v5e has (the compiler's own refusal), so it is listed
    as not fitting and never ranked."""
    run = tmp_path / "plan"
    res = _plan(LLAMA, "--target", "v5e:2x2", "--mesh-axes", "fsdp", "--search", "batch-per-device=1,512",
                "--out", str(run), "--json",
                "--", "--seq", "512", "--vocab", "32768")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tpudiag.plan/1" and doc["status"] == "ok"
    fits, big = doc["candidates"]
    assert fits["choice"] == {"batch-per-device": 1} and fits["status"] == "ok" and fits["rank"] == 1
    assert fits["tokens_per_s_per_device"] > 0 and fits["peak_hbm_bytes"] < fits["hbm_capacity_bytes"]
    assert big["status"] == "does_not_fit" and big["rank"] is None
    assert big["peak_hbm_bytes"] > big["hbm_capacity_bytes"] and "exceeds available HBM" in big["reason"]
    assert doc["best"] == 0 and doc["reproduce"].startswith("tpudiag estimate ")
    assert "--mesh fsdp=4" in doc["reproduce"] and doc["reproduce"].endswith("--batch-per-device 1")
    # each candidate is a whole estimate run, and the plan re-renders without re-estimating
    est = json.loads((run / fits["estimate_run"] / "estimate.json").read_text())
    assert est["status"] == "ok"
    # no matmul compiled alone, but the matmuls take the cycles the compiler's cost model recorded
    assert not (run / fits["estimate_run"] / "estimate" / "probes").exists()
    assert any("timed by the TPU compiler's convolution cost model" in f for f in est["findings"])
    again = subprocess.run([sys.executable, "-m", "tpudiag", "report", "--json", str(run)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout) == doc, again.stderr[-2000:]
    # no activation offload: nothing exposed on the host link; a plan written before the field reads None
    assert fits["exposed_host_s"] == 0.0 and big["exposed_host_s"] is None
    older = {**doc, "candidates": [{k: v for k, v in c.items() if k != "exposed_host_s"} for c in doc["candidates"]]}
    assert [c.exposed_host_s for c in Plan.from_dict(older).candidates] == [None, None]
