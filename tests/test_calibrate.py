"""`tpudiag calibrate` and the measured v5e table tpudiag ships (tpudiag/tables/calibration_v5e.json,
written by `tpudiag calibrate` on a v5e): every figure derived from a named measurement of the
table, none faster than the chip's data sheet allows, the flash kernels' measured shares, the
microbenchmarks lowering for a TPU, and the command's bad inputs. Measuring needs a TPU (run on
the chip: `tpudiag calibrate`); the test of that is marked `tpu`."""

from __future__ import annotations

import glob
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tpudiag.errors import InputError
from tpudiag.api.calibrate import read_calibration, shipped
from tpudiag.results.calibration import Calibration
from tpudiag.targets import resolve_target

V5E = resolve_target("v5e").chip


def test_the_shipped_v5e_table_derives_every_figure_from_a_measurement_of_it():
    cal = shipped("v5e")
    assert cal is not None and cal.chip == "v5e" and cal.device == "TPU v5 lite" and cal.jax == "0.10.2"
    figures = cal.figures(V5E)
    names = {m.name for m in cal.measurements if m.status == "ok"}
    assert {"hbm_copy_bytes_per_s", "hbm_read_bytes_per_s", "hbm_write_bytes_per_s", "op_floor_s",
            "mxu_bf16_flops_per_s", "mxu_int8_ops_per_s", "sort_s_per_element", "gather_bytes_per_s",
            "pallas_step_s", "pallas_dma_4kib_s", "kernel:flash_attention_fwd@d64@s2048"} <= set(figures)
    for f in figures.values():
        assert f.source in names, f
        assert f.value > 0
        if f.ratio is not None:  # the chip never beats its data sheet on these
            assert f.ratio <= 1.02, f
    # the copy bandwidth is what the 512 MiB copy moved in its fastest call
    copy = cal.measurement("hbm_copy_512mib")
    assert figures["hbm_copy_bytes_per_s"].value == pytest.approx(copy.work["bytes"] / (copy.min_us / 1e6))
    assert cal.to_dict() == Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))).to_dict()


def test_flash_kernel_shares_fall_with_the_head_dim_and_pick_the_nearest():
    cal = shipped("v5e")
    peak = V5E.peak_bf16_flops_per_s
    shares = cal.kernel_shares(peak)
    for k in ("flash_attention_fwd", "flash_attention_dq", "flash_attention_dkv"):
        for s in (1024, 2048, 4096, 8192):
            # a head dim of 64 fills half the MXU's 128-deep contraction: about half the share of 128
            assert 0.3 < shares[k, 64, s][0] / shares[k, 128, s][0] < 0.7
        # longer sequences amortize the diagonal tiles and the per-block work
        assert shares[k, 128, 1024][0] < shares[k, 128, 2048][0] <= shares[k, 128, 4096][0] * 1.05
        assert shares[k, 128, 4096][0] <= shares[k, 128, 8192][0] * 1.05
        assert cal.kernel_share(k, 64, 2048, peak) == shares[k, 64, 2048]
        assert cal.kernel_share(k, 80, 2048, peak) == shares[k, 64, 2048]  # nearest head dim first
        assert cal.kernel_share(k, 256, 2500, peak) == shares[k, 128, 2048]  # then the nearest sequence by ratio
        assert cal.kernel_share(k, 128, 16384, peak) == shares[k, 128, 8192]
        assert cal.kernel_share(k, 128, 5000, peak) == shares[k, 128, 4096]
    assert cal.kernel_share("no_such_kernel", 64, 2048, peak) is None


def test_a_bad_calibration_file_is_one_error_naming_it(tmp_path):
    with pytest.raises(InputError, match="nowhere.json: no such calibration file"):
        read_calibration(tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="bad.json: not a calibration file"):
        read_calibration(bad)
    bad.write_text(json.dumps({"schema": "tpudiag.report/1"}))
    with pytest.raises(InputError, match="bad.json: not a tpudiag calibration"):
        read_calibration(bad)
    bad.write_text(json.dumps({"schema": "tpudiag.calibration/1", "chip": "v5e"}))
    with pytest.raises(InputError, match="bad.json: a malformed calibration"):
        read_calibration(bad)


def _tpudiag(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          timeout=300)


def test_show_prints_the_shipped_table_and_its_json_round_trips(tmp_path):
    res = _tpudiag("calibrate", "--show", "v5e", "--no-color", "--width", "140")
    assert res.returncode == 0, res.stderr
    assert "hbm_copy_bytes_per_s" in res.stdout and "hbm_copy_512mib" in res.stdout
    assert "kernel:flash_attention_dkv@d64@s2048" in res.stdout
    as_json = _tpudiag("calibrate", "--show", "v5e", "--json")
    doc = json.loads(as_json.stdout)
    assert doc["schema"] == "tpudiag.calibration/1"
    path = tmp_path / "mine.json"
    path.write_text(as_json.stdout)
    again = _tpudiag("calibrate", "--show", str(path), "--md")
    assert again.returncode == 0 and "| hbm_copy_bytes_per_s |" in again.stdout


@pytest.mark.parametrize("args,message", [
    (("--show", "v4"), "--show v4: tpudiag ships no calibration for v4"),
    (("--show", "nowhere.json"), "nowhere.json: no such calibration file"),
])
def test_bad_input_is_one_line(args, message):
    res = _tpudiag("calibrate", *args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"tpudiag: error: {message}"), res.stderr


@pytest.mark.skipif(bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")), reason="a TPU is attached")
def test_without_a_tpu_calibrate_says_so_and_writes_nothing(tmp_path):
    res = _tpudiag("calibrate", "--out", str(tmp_path / "cal.json"), "--only", "op_smallest")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()  # refused before any work: no progress line first
    assert len(lines) == 1 and lines[0].startswith("tpudiag: error: calibrate: no TPU backend here"), res.stderr
    assert not (tmp_path / "cal.json").exists()
    existing = tmp_path / "there.json"
    existing.write_text("{}")
    res = _tpudiag("calibrate", "--out", str(existing))
    assert res.returncode == 2 and "already exists" in res.stderr and existing.read_text() == "{}"


def test_every_microbenchmark_lowers_for_a_tpu():
    """The worker's programs (Pallas kernels included) lower for the TPU; the v5e ran them all."""
    import jax

    from tpudiag.capture.calibrate_chip import programs

    items = programs()
    shipped_names = {m.name for m in shipped("v5e").measurements}
    assert {p["name"] for p in items} <= shipped_names | {"hbm_to_pinned_host", "pinned_host_to_hbm"}
    for p in items:
        text = jax.jit(p["fn"]).trace(*p["args"]).lower(lowering_platforms=("tpu",)).as_text()
        assert "func" in text, p["name"]


@pytest.mark.tpu
@pytest.mark.skipif(not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")),
                    reason="needs a TPU attached to this machine (run on the chip)")
def test_on_the_chip_calibrate_measures_within_the_data_sheet(tmp_path):
    out = tmp_path / "cal.json"
    res = _tpudiag("calibrate", "--out", str(out), "--only", "hbm,mxu,host", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    cal = read_calibration(out)
    figures = cal.figures(resolve_target(cal.chip).chip)
    assert 0.5 < figures["hbm_copy_bytes_per_s"].ratio <= 1.02
    assert 0.5 < figures["mxu_bf16_flops_per_s"].ratio <= 1.02
    assert cal.measurement("mxu_bf16_square").work["static_cycles"] > 0


def test_the_square_matmuls_static_cycles_are_the_compilers_for_it(oldest_leg):
    """The shipped table's static cycles for its square matmul are what the TPU compiler of the
    table's jax (0.10.2, libtpu 0.0.42.1) gives for that matmul compiled for a v5e here, and the
    chip took 1.06x them: the factor the estimate sets probes' cycles at."""
    from tpudiag.api.calibrate import square_static_cycles

    cal = shipped("v5e")
    m = cal.measurement("mxu_bf16_square")
    assert square_static_cycles("v5e") == m.work["static_cycles"]
    ratio = cal.figures(V5E)["mxu_bf16_static_ratio"]
    assert ratio.value == pytest.approx(m.seconds * V5E.clock_hz / m.work["static_cycles"])
    assert 1.0 < ratio.value < 1.1 and cal.figures(None).get("mxu_bf16_static_ratio") is None


def test_the_estimate_pass_moves_hbm_ops_by_the_measured_bandwidth_and_says_so():
    """On a real v5e compile (an FSDP step's HBM-bound ops): each moved op carries its factor and
    source, the finding names the rule, and a table measured with another jax says so."""
    from dataclasses import replace

    from tpudiag import api
    from tpudiag.analyze.compile.calibrated import calibrate_ops
    from tpudiag.parse.hlo import read_hlo_file

    run = ROOT / "fixtures" / "artifacts" / "compile_v5e_fsdp_async"
    report = api.load_report(run)
    m = report.modules[0]
    hlo = read_hlo_file(run / "modules" / "00-jit_train_step" / "optimized.hlo.txt")
    cal = shipped("v5e")
    copy = cal.figures(V5E)["hbm_copy_bytes_per_s"]
    moved, notes = calibrate_ops(report, hlo, cal, V5E, running_jax=cal.jax)
    before = {o.name: o for o in m.ops}
    changed = [o for o in moved.modules[0].ops if o.calibrated]
    assert changed and all(before[o.name].bound_by == "hbm" for o in changed)
    for o in changed:
        if o.calibrated.startswith("x"):
            assert o.estimated_s == pytest.approx(before[o.name].estimated_s * V5E.hbm_bytes_per_s / copy.value,
                                                  rel=1e-6)
            assert o.calibrated == f"x{V5E.hbm_bytes_per_s / copy.value:.2f} at 644.7 GB/s (hbm_copy_512mib)"
    assert all(o.calibrated is None for o in moved.modules[0].ops if o.bound_by == "ici")  # collectives: modelled
    assert any("HBM-bound op(s) at the measured copy bandwidth" in n for n in notes)
    assert not any("measured with jax" in n for n in notes)
    _, other = calibrate_ops(report, hlo, replace(cal, jax="0.0.1"), V5E, running_jax=cal.jax)
    assert other[-1].startswith(f"calibration (v5e) measured with jax 0.0.1; this is jax {cal.jax}")
