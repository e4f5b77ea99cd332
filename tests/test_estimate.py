"""`tpudiag estimate`: the MaxText-style Llama program runs for real at a tiny size, is estimated on
a small slice, and refuses bad input in one line; a configuration too big for HBM is a finding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from tests.conftest import PROGRAMS, ROOT

LLAMA = PROGRAMS / "llama_train.py"


TINY = ["--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--d-ff", "512",
        "--vocab", "1024", "--seq", "128", "--batch-per-device", "2"]


def _run(*args, env_extra=None, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _losses(out: str) -> list[float]:
    return [float(x) for x in re.search(r"losses ([\d. ]+)", out).group(1).split()]


def test_llama_train_runs_for_real_and_learns_with_either_attention(newest_leg):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    xla = _run(str(LLAMA), *TINY, "--steps", "4", env_extra=env)
    flash = _run(str(LLAMA), *TINY, "--steps", "4", "--attention", "flash", env_extra=env)
    assert xla.returncode == 0 and flash.returncode == 0, xla.stderr[-2000:] + flash.stderr[-2000:]
    a, b = _losses(xla.stdout), _losses(flash.stdout)
    assert a[-1] < a[0] - 1.0  # it memorizes its one batch: the loss falls
    # the bundled flash kernel computes the same attention: the same first loss up to bfloat16
    # rounding, and training stays within 1% as the rounding differences accumulate
    assert a[0] == pytest.approx(b[0], abs=2e-3) and a == pytest.approx(b, rel=1e-2)


def test_estimate_a_tiny_step_on_a_slice(tmp_path, newest_leg):
    run = tmp_path / "est"
    res = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v5e:2x2", "--mesh", "fsdp=2,tensor=2",
               "--json", "--out", str(run), "--", *TINY,
               env_extra={"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"})
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tpudiag.estimate/1" and doc["status"] == "ok"
    assert doc["mesh"] == {"fsdp": 2, "tensor": 2}
    assert doc["libtpu_init_args"] == "--xla_tpu_enable_async_collective_fusion=true"
    step, devices = doc["step_s"], doc["target"]["devices"]
    b = doc["breakdown"]
    assert step > 0 and step == pytest.approx(b["compute_s"] + b["hbm_s"] + b["collective_s"])
    assert b["host_s"] == b["hidden_host_s"] == 0  # nothing offloaded
    assert doc["tokens"] == 2 * 4 * 128
    assert doc["tokens_per_s_per_device"] == pytest.approx(doc["tokens"] / step / devices)
    # model FLOPs, MaxText's way: 6 x matmul weights x tokens + causal attention
    l, d, h, k, hd, f, v, s = 2, 256, 4, 2, 64, 512, 1024, 128
    params = v * d + d + d * v + l * (2 * d + d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f)
    weights = 6 * (params - v * d) * doc["tokens"]
    attention = 12 * (doc["tokens"] / s) * s * s * h * hd * l / 2
    assert doc["model_flops"] == pytest.approx(weights + attention)
    assert doc["mfu"] == pytest.approx(doc["model_flops"] / (step * devices * doc["target"]["peak_bf16_flops_per_s"]))
    assert 0 < doc["mfu"] < 1 and doc["fits"] is True
    assert doc["top_ops"] and doc["leaves_out"]
    assert json.loads((run / "estimate.json").read_text()) == doc
    assert json.loads((run / "manifest.json").read_text())["status"] == "ok"
    assert (run / "estimate" / "step.mlir").is_file()
    again = _run("-m", "tpudiag", "report", "--json", str(run))  # re-rendered from the run, not recompiled
    assert again.returncode == 0 and json.loads(again.stdout) == doc


def test_one_chip_is_estimated_on_one_chip(tmp_path, newest_leg):
    """v5e:1x1 compiles on the smallest slice the compiler takes, with the program's mesh on one of
    its chips: no collectives, and the throughput is one device's."""
    run = tmp_path / "one"
    res = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v5e:1x1", "--json", "--out", str(run), "--",
               *TINY)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["mesh"] == {"fsdp": 1} and doc["target"]["single_chip"] is True
    assert doc["breakdown"]["collective_s"] == doc["breakdown"]["hidden_collective_s"] == 0
    assert doc["tokens"] == 2 * 128  # one device's batch
    assert doc["tokens_per_s_per_device"] == pytest.approx(doc["tokens"] / doc["step_s"])
    assert "one chip of v5e:2x2" in res.stderr
    # The embedding gradient, XLA's kCustom scatter fusion: all its bytes at the measured scatter bandwidth
    # (XLA's own cost analysis prices it by its FLOPs).
    from tpudiag.api.calibrate import shipped

    rate = shipped("v5e").figures(None)["scatter_bytes_per_s"]
    ops = json.loads((run / "report.json").read_text())["modules"][0]["ops"]
    scatter = [o for o in ops if o["opcode"] == "fusion" and o["name"].startswith("scatter")]
    assert scatter
    for o in scatter:
        assert o["estimated_s"] == pytest.approx(o["bytes_accessed"] / rate.value, rel=1e-6)
        assert o["calibrated"] == f"{o['bytes_accessed'] / 1e6:.3g} MB at {rate.value / 1e9:.4g} GB/s ({rate.source})"
    _check_copy_windows(run, doc)
    wrong = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v5e:1x1", "--mesh", "fsdp=4", "--",
                 *TINY)
    assert wrong.returncode == 2 and "one chip has 1" in wrong.stderr and "Traceback" not in wrong.stderr


def _check_copy_windows(run, doc):
    """The step's asynchronous copies: only the compute in each copy's window hides it, so ample
    compute there hides all of them and none leaves all of them exposed; the finding gives both."""
    from tpudiag.analyze.compile.async_copies import copy_time
    from tpudiag.analyze.hlo.loops import loop_runs
    from tpudiag.parse.hlo import read_hlo_file

    m = json.loads((run / "report.json").read_text())["modules"][0]
    hlo = read_hlo_file(next((run / "modules").glob("*/optimized.hlo.txt")))
    rows = [(o["name"], o["computation"], o["estimated_s"], o["runs"], o["bound_by"], o["opcode"]) for o in m["ops"]]

    def scaled(f):
        return [(n, c, s * f if b != "hbm" and op not in ("copy-start", "copy-done") else s, r, b, op)
                for n, c, s, r, b, op in rows]

    runs = loop_runs(hlo).runs
    got = copy_time(hlo, runs, rows)
    assert got is not None and 0 < got.exposed_s < got.copy_s
    assert copy_time(hlo, runs, scaled(1e9)).exposed_s == 0.0
    assert copy_time(hlo, runs, scaled(0.0)).exposed_s == pytest.approx(got.copy_s)
    (note,) = [f for f in doc["findings"] if f.startswith("asynchronous copies")]
    assert f"{got.copy_s * 1e3:.3g} ms at HBM bandwidth" in note and f"; {got.exposed_s * 1e3:.3g} ms of them" in note


def test_compute_bound_matmuls_are_timed_by_the_compilers_cycles_alone(tmp_path, oldest_leg):
    run = tmp_path / "probed"
    # Of the step's distinct compute-bound matmuls (16 and more), the three with the largest share are probed
    # (each a static-profile compile), the rest go to the cost model.
    res = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v5e:2x2", "--json", "--out", str(run),
               "--max-probes", "3", "--", "--layers", "2", "--d-model", "512", "--heads", "4", "--kv-heads", "2",
               "--head-dim", "128", "--d-ff", "2048", "--vocab", "4096", "--seq", "512", "--batch-per-device", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "timing up to 3 distinct matmul(s)" in res.stderr
    doc = json.loads(res.stdout)
    probed = [f for f in doc["findings"] if "each compiled alone (estimate/probes/)" in f]
    assert len(probed) == 1, doc["findings"]
    assert len(sorted((run / "estimate" / "probes").glob("probe*.hlo.txt"))) == 3
    report = json.loads((run / "report.json").read_text())
    timed = [o for o in report["modules"][0]["ops"] if o["cycles_source"] == "matmul_probe"]
    assert timed
    # each probe's cycles at the v5e's measured time for the square bf16 matmul over the compiler's static
    # cycles for it (the shipped calibration)
    from tpudiag.api.calibrate import shipped
    from tpudiag.targets import resolve_target

    ratio = shipped("v5e").figures(resolve_target("v5e").chip)["mxu_bf16_static_ratio"]
    assert 1.0 < ratio.value < 1.2 and ratio.source == "mxu_bf16_square"
    for o in timed:
        assert o["bound_by"] == "static_cycles" and o["estimated_cycles"] > 0 and "alone (probe" in o["limit"]
        assert o["estimated_s"] >= o["flops"] / doc["target"]["peak_bf16_flops_per_s"]
        assert o["estimated_s"] == pytest.approx(o["estimated_cycles"] / doc["target"]["clock_hz"] * ratio.value,
                                                 rel=1e-6)
        assert o["calibrated"].startswith(f"x{ratio.value:.3f} the probe's cycles (mxu_bf16_square")
    assert any(f.startswith("calibration (v5e") and "probes' static cycles" in f for f in doc["findings"])
    # the probes' cycles only ever lengthen an op: the step is the sum of its ops' times x runs
    ops = report["modules"][0]["ops"]
    assert doc["step_s"] >= sum(o["estimated_s"] * o["runs"] for o in timed)
    assert all(o["cycles_source"] != "matmul_probe" or o["bound_by"] == "static_cycles" for o in ops)


def test_grouped_matmuls_are_timed_over_the_row_tiles_they_visit(tmp_path, newest_leg):
    """JAX's megablox gmm, forward and backward: its grid is sized by the routing at run time, so the
    estimate counts its MXU work over the row tiles balanced routing visits (8192 rows over 8 experts
    in tiles of 512: 16 tiles, 7 boundaries inside tiles, 23 visits), not the kernel's useful FLOPs."""
    run = tmp_path / "gmm"
    res = _run("-m", "tpudiag", "estimate", f"{PROGRAMS / 'tpu_megablox.py'}:step", "--target", "v5e:2x2", "--json",
               "--out", str(run))
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    (note,) = [f for f in doc["findings"] if "grouped matmul" in f]
    assert note.startswith("3 grouped matmul(s)") and "1.44x-1.44x" in note
    ops = json.loads((run / "report.json").read_text())["modules"][0]["ops"]
    gmm = [o for o in ops if "23 row-tile visits of 512 rows (16 tiles, 8 groups)" in o["limit"]]
    assert {o["opcode"] for o in gmm} == {"custom-call"} and len(gmm) == 3
    # at the v5e's measured bf16 matmul rate (the shipped calibration), not the data sheet's peak
    from tpudiag.api.calibrate import shipped
    from tpudiag.targets import resolve_target

    rate = shipped("v5e").figures(resolve_target("v5e").chip)["mxu_bf16_flops_per_s"]
    for o in gmm:  # forward, x's gradient (gmm) and the weights' (tgmm): useful FLOPs 2 x 8192 x 4096 x 1792 each
        assert o["flops"] == 2 * 8192 * 4096 * 1792
        assert o["bound_by"] == "compute" and o["estimated_s"] == pytest.approx(o["flops"] * 23 / 16 / rate.value,
                                                                                rel=1e-6)
        assert o["calibrated"] == f"x{rate.ratio ** -1:.2f} ({rate.source})"
    assert doc["breakdown"]["compute_s"] >= sum(o["estimated_s"] * o["runs"] for o in gmm)


def test_splash_attention_is_timed_by_its_kernels_mxu_work(tmp_path, newest_leg):
    """JAX's splash attention gives no cost estimate: the compile worker writes the step's block
    masks beside its HLO and the estimate counts each kernel's matmuls over the blocks a causal mask
    keeps (sequence 2048 in blocks of 512: 10 of 16), not 0 FLOPs; each kernel is then timed by the
    compiler's cycles for one of those blocks."""
    run = tmp_path / "splash"
    res = _run("-m", "tpudiag", "estimate", f"{PROGRAMS / 'tpu_splash.py'}:step", "--target", "v6e:2x2", "--json",
               "--out", str(run), "--", "--heads", "2", "--seq", "2048", "--block", "512")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    (note,) = [f for f in doc["findings"] if "Pallas kernel" in f and "MXU work read" in f]
    assert note.startswith("3 Pallas kernel op(s) with no cost estimate of their own")
    assert "could not be evaluated" not in note
    (tables,) = (run / "modules").glob("*/kernel_tables.json")
    masks = [v for k, v in json.loads(tables.read_text()).items() if "block_mask" in k]
    assert masks and all(sum(1 for x in m if x) == 10 for m in masks)
    ops = json.loads((run / "report.json").read_text())["modules"][0]["ops"]
    splash = {o["name"].rsplit(".", 1)[0]: o for o in ops if o["name"].startswith("splash_mha")}
    per_block = 2 * 512 * 512 * 128
    matmuls = {"splash_mha_fwd_residuals": 2, "splash_mha_dkv_no_residuals": 4, "splash_mha_dq_no_residuals": 3}
    assert set(splash) == set(matmuls)
    peak = doc["target"]["peak_bf16_flops_per_s"]
    for name, o in splash.items():
        assert o["flops"] == 2 * 10 * matmuls[name] * per_block
        # each kernel compiled alone for 2 and 3 of its key blocks, the mask's branches made to hold:
        # the compiler's cycles for one block, times the 20 blocks that run, are longer than the matmuls
        assert o["cycles_source"] == "kernel_probe" and o["bound_by"] == "static_cycles"
        assert re.fullmatch(r"compiler cycles for one grid step, alone \(kprobe0[0-2]\), x 20 active steps", o["limit"])
        assert o["estimated_s"] > o["flops"] / peak
    (probed,) = [f for f in doc["findings"] if "cycles for their grid steps" in f]
    assert probed.startswith("3 Pallas kernel op(s) (3 distinct, 3 kind(s) of grid step) timed by the TPU compiler")
    assert "gave no cycles" not in probed and "not probed" not in probed
    assert len(list((run / "estimate" / "kernel_probes").glob("kprobe*.mlir"))) == 6


def test_offloaded_layer_inputs_are_timed_on_the_host_link(tmp_path, newest_leg):
    """`--remat offload` sends each layer's input to pinned host memory and reads it back for the
    backward pass: the compiled step's transfers are found, their bytes are the layer inputs', and
    their time on v6e's host link is split into what the compute beside them hides and the rest."""
    from tpudiag.analyze.compile.estimate import TIMED_HOST
    from tpudiag.analyze.compile.host_transfers import host_time, host_transfers, offload_bytes
    from tpudiag.analyze.hlo.loops import loop_runs
    from tpudiag.analyze.plan import candidate_row
    from tpudiag.parse.hlo import read_hlo_file
    from tpudiag.report import plan_render
    from tpudiag.results.estimate import EstimateReport

    run = tmp_path / "offload"
    res = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v6e:2x2", "--json", "--no-matmul-probes",
               "--out", str(run), "--", *TINY, "--remat", "offload")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    layer_input = 2 * 128 * 256 * 2  # batch per device x seq x d_model, bf16
    moved = [f for f in doc["findings"] if "move between HBM and host memory" in f]
    assert len(moved) == 1 and "on the host link at 32 GB/s each way per device" in moved[0], doc["findings"]
    b = doc["breakdown"]
    assert doc["step_s"] == pytest.approx(b["compute_s"] + b["hbm_s"] + b["collective_s"] + b["host_s"])
    assert [x for x in doc["leaves_out"] if "host memory" in x] == [TIMED_HOST]
    # a plan's row of this estimate carries its exposed host time, and the plan's table shows it
    row = replace(candidate_row({"fsdp": 4}, {"remat": "offload"}, EstimateReport.from_dict(doc), "offload"), rank=1)
    assert row.exposed_host_s == b["host_s"] > 0
    cells = plan_render._cells(row)
    assert cells[plan_render._COLUMNS.index("exposed host")] == f"{b['host_s'] * 1e3:.3g} ms"
    assert cells[plan_render._COLUMNS.index("exposed coll.")] == f"{b['collective_s'] * 1e3:.3g} ms"
    # the same transfers, read back from the run's HLO: each layer's input comes back once; what goes out
    # is whole layer inputs (at two layers the compiler writes the last one into the host buffer and also
    # copies it out apart, both from HBM)
    hlo = read_hlo_file(next((run / "modules").glob("*/optimized.hlo.txt")))
    transfers = host_transfers(hlo, loop_runs(hlo).runs)
    out, back = offload_bytes(transfers)
    assert back == 2 * layer_input and out in (2 * layer_input, 3 * layer_input)
    assert f"{(out + back) / 1e9:.3g} GB per step per device" in moved[0]
    assert all(t.done is not None for t in transfers)  # asynchronous: each has its done
    # transfers grouped in one window share the link: between one direction's bytes and both
    link = b["host_s"] + b["hidden_host_s"]
    assert max(out, back) / 32e9 <= link * (1 + 1e-9) and link <= (out + back) / 32e9 * (1 + 1e-9)
    report = json.loads((run / "report.json").read_text())
    names = {c["name"] for c in report["modules"][0]["collectives"]}
    ops = [(o["name"], o["computation"], o["estimated_s"], o["runs"]) for o in report["modules"][0]["ops"]
           if o["name"] not in names]
    # a link far slower than the compute leaves almost all of it exposed; a link with no cost, none
    slow = host_time(hlo, transfers, ops, 1e3)
    assert slow.exposed_s > 0.99 * slow.link_s > 0
    assert host_time(hlo, transfers, ops, 1e18).exposed_s == pytest.approx(0, abs=1e-9)


def test_a_config_too_big_for_hbm_is_a_finding_not_a_crash(tmp_path, newest_leg):
    """Llama 3.1 8B at sequence 8192 with XLA's attention: the [batch, heads, seq, seq] scores do
    not fit a v6e's HBM. The TPU compiler's own figures come back as the finding; exit 0."""
    res = _run("-m", "tpudiag", "estimate", f"{LLAMA}:step", "--target", "v6e-256", "--json", "--out",
               str(tmp_path / "big"), "--", "--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8",
               "--head-dim", "128", "--d-ff", "14336", "--vocab", "128256", "--seq", "8192", "--batch-per-device", "4",
               "--attention", "xla")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "failed" and doc["fits"] is False
    assert doc["peak_hbm_bytes"] > doc["hbm_capacity_bytes"] > 30 * 2**30
    assert any("HBM per device" in f for f in doc["findings"])
    assert doc["model_flops"] > 0 and doc["mfu"] is None


def _bad(*args, tmp_path) -> tuple[int, str]:
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
    res = _run("-m", "tpudiag", "estimate", *args, "--out", str(out), timeout=300)
    if out.exists():  # a refusal after the run began says so in its manifest
        assert json.loads((out / "manifest.json").read_text())["status"] == "failed"
    lines = [x for x in res.stderr.splitlines() if x.startswith("tpudiag: error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    return res.returncode, lines[0]


def test_bad_input_is_one_line(tmp_path):
    code, line = _bad(f"{LLAMA}", "--target", "v5e:2x2", tmp_path=tmp_path)
    assert code == 2 and "expected FILE.py:FUNC" in line
    code, line = _bad("nowhere.py:step", "--target", "v5e:2x2", tmp_path=tmp_path)
    assert code == 2 and "nowhere.py: no such file" in line
    code, line = _bad(f"{LLAMA}:step", "--target", "v5e:2x2", "--mesh", "fsdp=3", tmp_path=tmp_path)
    assert code == 2 and "--mesh fsdp=3 has 3 devices; v5e:2x2 has 4" in line
    code, line = _bad(f"{LLAMA}:stpe", "--target", "v5e:2x2", tmp_path=tmp_path)
    assert code == 2 and "no function 'stpe'" in line and "step" in line
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def step(argv, mesh):\n    return 42\n")
    code, line = _bad(f"{wrong}:step", "--target", "v5e:2x2", tmp_path=tmp_path)
    assert code == 2 and "returned int" in line and "'step', 'args' and 'tokens'" in line
    # the program's own argument error (argparse inside FUNC): its message, in the one line
    res = _run("-m", "tpudiag", "estimate", f"{PROGRAMS / 'llama_decode.py'}:step", "--target", "v5e:2x2", "--mesh",
               "tensor=4", "--out", str(tmp_path / "args"), "--", "--cache", "paged", "--max-len", "10", "--context",
               "64", timeout=300)
    said = [x for x in res.stderr.splitlines() if "lowering failed" in x]
    assert res.returncode == 1 and len(said) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "--max-len 10 leaves no room after --context 64" in said[0] and "lower.log" in said[0]


def test_estimate_a_tiny_decode_step(tmp_path, newest_leg):
    res = _run("-m", "tpudiag", "estimate", f"{PROGRAMS / 'llama_decode.py'}:step", "--target", "v5e:2x2",
               "--mesh", "data=2,tensor=2", "--json", "--out", str(tmp_path / "dec"), "--", "--layers", "2",
               "--d-model", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--d-ff", "512", "--vocab",
               "1024", "--context", "64", "--batch", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["tokens"] == 4 and doc["step_s"] > 0
    l, d, h, k, hd, f, v, ctx, b = 2, 256, 4, 2, 64, 512, 1024, 64, 4
    params = v * d + d + d * v + l * (2 * d + d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f)
    assert doc["model_flops"] == pytest.approx(2 * (params - v * d) * b + 4 * b * ctx * h * hd * l)
    # one all-reduce after attention and one after the MLP per layer, over the tensor axis
    report = json.loads((tmp_path / "dec" / "report.json").read_text())
    axes = {tuple(c["mesh_axes"] or ()) for m in report["modules"] for c in m["collectives"]}
    assert ("tensor",) in axes
    # the buffers live at the HBM peak, from XLA's live-range dump: the stacked [2, 4, 64, 1, 64]
    # per-device K and V caches are there, as parameters
    bufs = doc["peak_buffers"]
    assert bufs and all(b["bytes"] > 0 and b["kind"] in ("parameter", "output", "temporary") for b in bufs)
    assert bufs == sorted(bufs, key=lambda b: -b["bytes"])
    cache = [b for b in bufs if b["where"] == "parameters bf16[2,4,64,1,64]"]
    assert cache and cache[0]["count"] == 2 and cache[0]["bytes"] >= 2 * 2 * 4 * 64 * 64 * 2


def test_paged_decode_writes_the_cache_in_place_and_reads_it_with_the_kernel(tmp_path, newest_leg):
    args = ["--layers", "2", "--d-model", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "128", "--d-ff",
            "512", "--vocab", "1024", "--context", "200", "--batch", "4", "--cache", "paged", "--max-len", "256",
            "--page-size", "64"]
    real = _run(str(PROGRAMS / "llama_decode.py"), *args)  # runs for real on CPU (the kernel's reference)
    assert real.returncode == 0 and "llama_decode: 1 devices, tokens" in real.stdout, real.stderr[-2000:]
    res = _run("-m", "tpudiag", "estimate", f"{PROGRAMS / 'llama_decode.py'}:step", "--target", "v5e:2x2",
               "--mesh", "tensor=2,data=2", "--json", "--out", str(tmp_path / "paged"), "--", *args)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["fits"]
    hlo = next((tmp_path / "paged" / "modules").glob("*/hlo/*after_optimizations.txt")).read_text()
    report = json.loads((tmp_path / "paged" / "report.json").read_text())
    kernels = [o for o in report["modules"][0]["ops"] if o["name"].startswith("tpudiag_paged_attention")]
    assert len(kernels) == 2 and all(o["bytes_accessed"] > 0 for o in kernels)  # one call a layer
    # the new token's K/V is scattered into its page of the donated pool, never a dynamic-update-slice
    # of a whole cache
    assert " scatter(" in hlo and "dynamic-update-slice(" not in hlo
