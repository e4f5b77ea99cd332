"""`tpudiag compile`: the report of a real v5e compile (goldens and oracles), and real end-to-end
compiles with libtpu's compile-only client (a few seconds each)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACT_SETS, ARTIFACTS, GOLDENS, ROOT, check_golden
from tpudiag.cli import cli, main

RUN = "fixtures/artifacts/compile_v5e_collective"


def _doc(in_root_dir=None) -> dict:
    result = CliRunner().invoke(cli, ["report", "--json", RUN])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("artifact_set", ARTIFACT_SETS)
@pytest.mark.parametrize("flags,suffix", [(["--json"], "report.json"), (["--md"], "report.md"),
                                          (["--no-color", "--width", "120"], "report.txt")])
def test_compile_report_golden(artifact_set, flags, suffix, in_root, update_goldens):
    run = (ARTIFACT_SETS[artifact_set] / "compile_v5e_collective").relative_to(in_root)
    result = CliRunner().invoke(cli, ["report", *flags, str(run)])
    assert result.exit_code == 0, result.output
    check_golden(GOLDENS / artifact_set / "compile_v5e_collective" / suffix, result.output, update_goldens)


def test_static_cycles_are_the_compilers_own(in_root):
    """Every per-op cycle count is the one in the TPU compiler's static-profile file (read by regex here)."""
    doc = _doc()
    checked = 0
    for m in doc["modules"]:
        files = {}
        for p in (ROOT / m["artifacts"] / "static_profile").glob("*.textproto"):
            text = p.read_text()
            for op, cycles in re.findall(r'hlo_op_name: "([^"]+)"\s+estimated_cycles: (\d+)', text):
                files[op] = int(cycles)
        rows = [o for o in m["ops"] if o["cycles_source"] == "static_profile"]
        for o in rows:
            assert o["estimated_cycles"] == files[o["name"]], (m["name"], o["name"])
            checked += 1
        # A loop body's op counts once per trip (`runs`); the compiler's file has one run.
        assert m["totals"]["estimated_cycles"] == sum(o["estimated_cycles"] * o["runs"] for o in rows)
        # Every profiled op that executes as a unit is a row (the rest are async tails, tuples, loops).
        assert {o["name"] for o in rows} <= set(files)
    assert checked >= 20


def test_estimates_follow_the_stated_rule(in_root):
    doc = _doc()
    t = doc["target"]
    for m in doc["modules"]:
        for o in m["ops"]:
            # bytes in VMEM (S(1) in the op's or its operands' layouts) are not HBM traffic
            assert o.get("hbm_bytes", o["bytes_accessed"]) <= o["bytes_accessed"]
            candidates = {"hbm": o.get("hbm_bytes", o["bytes_accessed"]) / t["hbm_bytes_per_s"],
                          "compute": o["flops"] / t["peak_bf16_flops_per_s"]}
            if o["estimated_cycles"] is not None:
                candidates["static_cycles"] = o["estimated_cycles"] / t["clock_hz"]
            if o["modelled"]:
                candidates["ici"] = o["ici_bytes"] / t["ici_ring_bytes_per_s"]
            assert o["estimated_s"] == pytest.approx(max(candidates.values()), rel=1e-6, abs=1e-12)
            assert o["bound_by"] == max(candidates, key=candidates.get)


def test_collectives_are_modelled_not_free(in_root):
    step = next(m for m in _doc()["modules"] if m["name"] == "jit_step")
    collectives = [o for o in step["ops"] if o["opcode"] in ("all-reduce", "all-gather")]
    assert collectives and all(o["modelled"] and o["cycles_source"] == "not_estimated" for o in collectives)
    assert any(o["ici_bytes"] > 0 for o in collectives)
    assert any("collective times are a model" in f for f in step["findings"])


def _default_space_total(module_doc) -> int:
    """The default memory space's total in the module's XLA memory report, read here on its own."""
    (report,) = Path(module_doc["artifacts"], "hlo").glob("*after_optimizations-memory-usage-report.txt")
    text = report.read_text()
    return int(re.search(r"Memory Space: default.*\nTotal bytes: (\d+)", text).group(1))


def test_memory_totals(in_root):
    for m in _doc()["modules"]:
        mem = m["totals"]["memory"]
        # The compiler's own figure (its buffer assignment), never more than the memory analysis sums.
        assert mem["peak_source"] == "buffer_assignment"
        assert mem["peak_hbm_bytes"] == _default_space_total(m)
        assert 0 < mem["peak_hbm_bytes"] <= (mem["argument_bytes"] + mem["output_bytes"] - mem["alias_bytes"]
                                             + mem["temp_bytes"] + mem["generated_code_bytes"])
        assert mem["fits"] is True and mem["hbm_capacity_bytes"] == 16 * 2**30


def test_targets_json():
    doc = json.loads(CliRunner().invoke(cli, ["targets", "--json"]).output)
    assert doc["schema"] == "tpudiag.targets/1"
    assert {r["name"] for r in doc["targets"]} == {"v4", "v5e", "v5p", "v6e", "tpu7x"}


# ------------------------------------------------------------------ real compiles


def tpudiag(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_compile_mlir_falls_back_when_the_static_profile_aborts(tmp_path):
    """The MLP train step has a gather: libtpu's static profile aborts on it (TPU-NOTES); the
    module is recompiled without it and still reported. Which ops libtpu profiled before aborting
    varies from run to run, so none are kept: the report is the same each time."""
    mlir = next((ARTIFACTS / "mlp" / "ir").glob("*jit_train_step*.mlir"))
    p = tpudiag("compile", "--target", "v5e", "--json", "--out", str(tmp_path / "run"), str(mlir))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (m,) = doc["modules"]
    assert m["status"] == "ok" and m["static_profile"].startswith("dropped: the TPU compiler aborted")
    assert "Static LLO profiling" in m["static_profile"]
    assert m["ops"] and all(o["cycles_source"] == "off" for o in m["ops"])
    assert not (Path(m["artifacts"]) / "static_profile").exists()
    assert m["totals"]["flops"] > 0 and m["totals"]["estimated_s"] > 0
    assert "libtpu" not in p.stderr.lower() and "Failed to find host bounds" not in p.stderr, "libtpu noise hidden"
    again = json.loads(tpudiag("report", "--json", str(tmp_path / "run")).stdout)
    assert again == doc


def test_compile_hlo_text_without_static_profile(tmp_path):
    hlo = next((ARTIFACTS / "mlp" / "hlo").glob("*jit_train_step.before_optimizations.txt"))
    p = tpudiag("compile", "--target", "v6e", "--no-static-profile", "--md", "--out", str(tmp_path / "run"), str(hlo))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("## tpudiag compile") and "v6e" in p.stdout
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["modules"][0]["static_profile"] == "off" and doc["modules"][0]["ops"]


def test_python_api(tmp_path):
    code = f"""
import jax, jax.numpy as jnp, json, tpudiag
f = lambda x, w: jnp.tanh(x @ w)
spec = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
r = tpudiag.compile(f, spec, spec, target="v5e", out={str(tmp_path / 'run')!r}, static_profile=False)
print(json.dumps(r.report.to_dict()))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    (m,) = doc["modules"]
    assert m["status"] == "ok"
    dots = [o for o in m["ops"] if o["flops"] >= 2 * 512**3]
    assert dots, "the matmul is there with its exact FLOPs"
    assert any(o["source"] and "<string>" not in o["source"] or o["source"] for o in m["ops"])


@pytest.mark.parametrize("args,needle,code", [
    (["--target", "v9", "x.mlir"], "valid targets: v4, v5e, v5p, v6e", 2),
    (["--target", "v5e", "missing.mlir"], "missing.mlir: no such file", 2),
    (["--target", "v5e", "README.md"], "README.md: unsupported input", 2),
])
def test_bad_input_is_one_line(args, needle, code):
    p = tpudiag("compile", *args)
    assert p.returncode == code
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_module_the_compiler_rejects_is_a_reported_failure(tmp_path):
    """A module MLIR's parser reads (a module it does not read is refused before the run:
    tests/test_error_paths.py) but the TPU compiler rejects is a failed module in a failed run."""
    bad = tmp_path / "bad.mlir"
    bad.write_text("module @rejected {\n"
                   "  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "    %0 = stablehlo.custom_call @tpudiag_no_such_target(%arg0) : (tensor<4xf32>) -> tensor<4xf32>\n"
                   "    return %0 : tensor<4xf32>\n  }\n}\n")
    p = tpudiag("compile", "--target", "v5e", "--json", "--out", str(tmp_path / "run"), str(bad))
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["status"] == "failed" and doc["modules"][0]["status"] == "failed"
    assert doc["modules"][0]["error"]
    # stderr (not a terminal): the module's progress line, then the verdict
    progress_line, verdict = p.stderr.strip().splitlines()
    assert re.fullmatch(r"tpudiag: module bad: failed, [\d.]+ s: .*Custom emitter for tpudiag_no_such_target.*",
                        progress_line), progress_line
    assert "1 of 1 module(s) failed to compile" in verdict


def test_missing_libtpu_names_the_install_line(monkeypatch, capsys):
    """Without libtpu the compile-only client does not exist: say how to install the matching one."""
    import importlib.util

    from tpudiag.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        main(["compile", "--target", "v5e", str(ARTIFACTS / "tpu_v5e_step" / "hlo")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "pip install 'jax[tpu]==0.10.2'" in err and len(err.strip().splitlines()) == 1


def _compiled_in_a_subprocess(code: str) -> dict:
    """The compile report `code` prints as its last line, run in its own Python (libtpu per process)."""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_program_the_compiler_fits_is_reported_as_fitting(tmp_path):
    """A remat'd 32-layer scan on a 16 GiB v5e whose memory analysis sums to 16.8 GiB: the compiler
    compiles it (its buffer assignment needs 14.75 GiB), so it fits; the sum is not the peak. On the
    newest jax leg only (CI time; the same figures on jax 0.10.2 and libtpu 0.0.42, checked by hand)."""
    import importlib.metadata as md

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) < (0, 11) and not os.environ.get("TPUDIAG_ALL_LEGS"):
        pytest.skip("a 10 s compile run on the newest jax leg only (CI time); TPUDIAG_ALL_LEGS=1 runs it")
    code = f"""
import jax, jax.numpy as jnp, json, tpudiag
def loss(w, x):
    def body(h, wl):
        return jax.checkpoint(lambda h, wl: jnp.tanh(h @ wl) + h)(h, wl), None
    h, _ = jax.lax.scan(body, x, w)
    return jnp.sum(h.astype(jnp.float32))
w = jax.ShapeDtypeStruct((32, 4096, 4096), jnp.bfloat16)
x = jax.ShapeDtypeStruct((45056, 4096), jnp.bfloat16)
step = jax.jit(jax.grad(loss), donate_argnums=0)
r = tpudiag.compile(step, w, x, target="v5e", out={str(tmp_path / 'run')!r}, static_profile=False)
print(json.dumps(r.report.to_dict()))
"""
    (m,) = _compiled_in_a_subprocess(code)["modules"]
    mem = m["totals"]["memory"]
    summed = (mem["argument_bytes"] + mem["output_bytes"] - mem["alias_bytes"] + mem["temp_bytes"]
              + mem["generated_code_bytes"])
    assert m["status"] == "ok" and summed > 16 * 2**30  # the sum alone would say it does not fit
    assert mem["peak_hbm_bytes"] == _default_space_total(m) < 15.75 * 2**30
    assert mem["fits"] is True and not any("needs" in f and "HBM" in f for f in m["findings"])


def test_a_program_that_does_not_fit_is_a_finding(tmp_path):
    """24 GiB of arguments and outputs on a 16 GiB v5e: reported, not a crash."""
    code = f"""
import jax, jax.numpy as jnp, json, tpudiag
spec = jax.ShapeDtypeStruct((3 * 2**30,), jnp.float32)
r = tpudiag.compile(lambda x: x * 2.0, spec, target="v5e", out={str(tmp_path / 'run')!r}, static_profile=False)
print(json.dumps(r.report.to_dict()))
"""
    (m,) = _compiled_in_a_subprocess(code)["modules"]
    # libtpu itself refuses it (RESOURCE_EXHAUSTED); tpudiag turns that into the finding.
    mem = m["totals"]["memory"]
    assert m["status"] == "failed" and mem["fits"] is False and mem["peak_hbm_bytes"] >= 24 * 2**30
    assert any(f.startswith("needs 24.0 GiB of HBM per device, a v5e device has 15.75 GiB usable")
               for f in m["findings"]), m["findings"]


def test_options_after_the_input_as_the_issue_writes_them(tmp_path):
    """`tpudiag compile model.mlir --target v6e:2x2 --json`: tpudiag's options may follow INPUT."""
    mlir = next((ARTIFACTS / "mlp" / "ir").glob("*jit_stage*.mlir"))
    p = tpudiag("compile", str(mlir), "--target", "v6e:2x2", "--json", "--out", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["target"]["topology"] == "v6e:2x2" and doc["modules"][0]["status"] == "ok"


def test_report_of_a_failed_script_names_its_input_and_why(tmp_path):
    """A real compile of a script that raises: the report (re-rendered later) names the input and the
    program's failure, from the manifest's source."""
    run = tmp_path / "run"
    script = "fixtures/programs/failing/raises.py"
    p = tpudiag("compile", "--target", "v5e", "--no-static-profile", "--json", "--out", str(run), script)
    assert p.returncode == 1, p.stderr[-2000:]
    manifest = json.loads((run / "manifest.json").read_text())
    shadow = {"exit_code": 1, "status": "failed", "reason": "program raised ValueError: boom from the program"}
    assert manifest["source"] == {"input": script, "kind": "script", "shadow_run": shadow}
    assert manifest["status"] == "failed" and manifest["reason"] == shadow["reason"]
    doc = json.loads(tpudiag("report", "--json", str(run)).stdout)
    assert doc["source"]["input"] == script and doc["source"]["shadow_run"] == shadow
    text = tpudiag("report", "--no-color", "--width", "200", str(run)).stdout
    assert text.splitlines()[1].startswith(f"│ {script}   target v5e")


def test_a_compile_stopped_during_its_script_still_names_its_input(tmp_path):
    """tpudiag killed (SIGKILL) while the script runs: the manifest already has the input, so the
    report does not show `?`."""
    import signal

    run = tmp_path / "run"
    script = "fixtures/programs/failing/sleeps.py"
    children: list[int] = []
    proc = subprocess.Popen([sys.executable, "-m", "tpudiag", "compile", "--target", "v5e", "--no-static-profile",
                             "--out", str(run), script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    try:
        assert proc.stdout.readline().strip() in ("started", "ready"), "the script is running"
        during = json.loads((run / "manifest.json").read_text())
        assert during["status"] == "running"
        assert during["source"] == {"input": script, "kind": "script"}
        children += [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid in children:  # the script tpudiag started, left running by the kill
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = tpudiag("report", "--no-color", "--width", "200", str(run)).stdout
    assert text.splitlines()[1].startswith(f"│ {script}   target v5e"), text


def test_garbage_mlir_is_refused_before_a_run_directory_exists(tmp_path, capsys):
    """As garbage HLO text is: exit 2, one line, nothing written."""
    from tpudiag.capture.inputs import file_inputs

    bad = tmp_path / "garbage.mlir"
    bad.write_text("this is not mlir\n")
    with pytest.raises(SystemExit) as e:
        main(["compile", "--target", "v5e", "--out", str(tmp_path / "run"), str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "garbage.mlir: not a StableHLO module" in err
    assert not (tmp_path / "run").exists()
    real = next((ARTIFACTS / "mlp" / "ir").glob("*jit_train_step*.mlir"))
    assert [(m.name, m.kind) for m in file_inputs(real)] == [("jit_train_step", "mlir")]
