"""The static profile's budget follows the work: a CPU-second limit (a busy machine does not shrink
it) scaled with the module's matmuls, the module's limit recorded, progress events while it runs, and
a rerun hint that names what the module ran out of. Real TPU compiles of real fixture modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, ROOT
from tpudiag.capture.tpu_compile import (Limits, ModuleCompile, ModuleInput, ModuleStarted, compile_modules,
                                         module_matmuls, static_limit_s)

SIZE_BASE_MATMULS, SIZE_MAX_SCALE = Limits().size_base_matmuls, Limits().size_max_scale

DECODER_IR = sorted((ARTIFACTS / "decoder" / "ir").glob("*.mlir"))


def test_the_limit_scales_with_the_modules_matmuls():
    counts = [module_matmuls(p) for p in DECODER_IR]
    assert counts == [p.read_text().count("stablehlo.dot_general ") for p in DECODER_IR]
    assert counts[:3] == [0, 0, 0] and counts[3] > SIZE_BASE_MATMULS, "setup modules have no matmul; the step has"
    setup, step = DECODER_IR[2], DECODER_IR[-1]
    limits = Limits(static_timeout_s=60)
    assert static_limit_s(setup, limits) == 60, "the RNG setup (260 operations, no matmul) gets the base"
    assert static_limit_s(step, limits) == pytest.approx(60 * counts[3] / SIZE_BASE_MATMULS, abs=1e-3)
    assert static_limit_s(step, Limits(static_timeout_s=60, scale_with_size=False)) == 60
    # The same module as HLO text (the CPU run's optimized dump) counts the same matmuls.
    (hlo,) = (ARTIFACTS / "decoder" / "hlo").glob("*jit_train_step.cpu_after_optimizations.txt")
    assert module_matmuls(hlo) == sum(1 for ln in hlo.read_text().splitlines() if " dot(" in ln)


def test_a_huge_module_is_capped_and_bytecode_gets_the_base(tmp_path):
    big = tmp_path / "big.mlir"
    line = "  %{} = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8x8xf32>)"
    big.write_text("\n".join(line.format(i) for i in range(100 * SIZE_BASE_MATMULS)))
    assert static_limit_s(big, Limits(static_timeout_s=10)) == 10 * SIZE_MAX_SCALE
    code = tmp_path / "code.mlir"
    code.write_bytes(b"ML\xefR" + bytes(range(256)) * 4)
    assert module_matmuls(code) is None and static_limit_s(code, Limits(static_timeout_s=10)) == 10


def test_progress_hears_each_start_with_its_limit_then_its_end(tmp_path):
    inputs = [ModuleInput(p.stem, p, "mlir") for p in DECODER_IR[:2]]
    events = []
    results = compile_modules(inputs, tmp_path / "m", "v5e:2x2", static_profile=True, jobs=1, cache=None,
                              limits=Limits(static_timeout_s=120), progress=events.append, group_setup=False)
    starts = [e for e in events if isinstance(e, ModuleStarted)]
    ends = [e for e in events if isinstance(e, ModuleCompile)]
    assert sorted(e.name for e in starts) == sorted(e.name for e in ends) == sorted(i.name for i in inputs)
    for s in starts:  # each start comes before its end, with the limit the module then ran under
        assert events.index(s) < next(i for i, e in enumerate(events) if isinstance(e, ModuleCompile)
                                       and e.name == s.name)
        assert s.static_limit_s == static_limit_s(next(i.path for i in inputs if i.name == s.name), Limits(120))
        assert s.cpu_s() == 0.0, "the worker is gone once the module is done"
    for r in results:
        assert r.status == "ok" and r.static_profile == "ok"
        meta = json.loads((r.dir / "module.json").read_text())
        assert meta["static_limit_s"] == r.static_limit_s == 120, "no matmuls in these two: the base"


def test_the_limit_is_cpu_seconds_and_a_drop_says_so(tmp_path):
    (res,) = compile_modules([ModuleInput("step", DECODER_IR[-1], "mlir")], tmp_path / "m", "v5e:2x2", jobs=1,
                             cache=None, limits=Limits(static_timeout_s=0.5, scale_with_size=False,
                                                       wall_per_cpu=100))  # a busy machine: the CPU limit first
    assert res.status == "ok" and res.static_limit_s == 0.5
    assert res.static_profile.startswith("dropped: timed out after 0 s of CPU (")
    assert res.static_profile.endswith(" s wall)")


def test_a_memory_drop_suggests_more_memory_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tpudiag", "compile", "--target", "v5e", "--no-cache", "--json",
                        "--static-memory", "0.1", "--out", str(out), str(DECODER_IR[-1])], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    (m,) = json.loads(p.stdout)["modules"]
    assert m["static_profile"] == "dropped: used more than 0.1 GiB"
    (hint,) = [f for f in m["findings"] if "Rerun this module alone" in f]
    command = hint.split("with more memory: ", 1)[1]
    assert command.startswith("tpudiag compile --target v5e:2x2 --static-memory 0.2 ")
    assert Path(command.rsplit(" ", 1)[1]).is_file()


def test_a_profile_stopped_for_time_keeps_the_ops_it_reached(tmp_path):
    """Stopped by its CPU limit part-way (the decoder step's profile writes its ops over a few CPU
    seconds), the module keeps the cycles of the ops already profiled: the plain compile made the same
    optimized module. The limit that stops it part-way depends on the machine's speed, so three are
    tried, the first that stops it part-way is checked."""
    for i, limit in enumerate((2.5, 3.5, 5.0)):
        (res,) = compile_modules([ModuleInput("step", DECODER_IR[-1], "mlir")], tmp_path / f"m{i}", "v5e:2x2",
                                 jobs=1, cache=None, limits=Limits(static_timeout_s=limit, scale_with_size=False,
                                                                   wall_per_cpu=100))
        if res.static_profile.startswith("partial: "):
            break
    else:
        pytest.fail(f"no limit stopped the profile part-way; the last: {res.static_profile}")
    assert res.status == "ok" and f"then timed out after {limit:.0f} s of CPU" in res.static_profile
    files = list((res.dir / "static_profile").iterdir())
    assert int(res.static_profile.split()[1]) == len(files) > 0
    from tpudiag.analyze.compile.report import build_compile_report
    from tpudiag.api.pipeline import module_artifacts
    from tpudiag.targets import resolve_target

    (m,) = build_compile_report(resolve_target("v5e"), [module_artifacts(res)], {}).modules
    profiled = [o for o in m.ops if o.cycles_source == "static_profile"]
    assert 0 < len(profiled) <= len(files) and len(profiled) < len(m.ops)
    assert {o.cycles_source for o in m.ops} == {"static_profile", "none"}
    assert any("the other ops' times are roofline floors" in f for f in m.findings)


def test_workers_keep_libtpus_file_logs_to_errors_unless_told(monkeypatch, tmp_path):
    """libtpu logs to /tmp/tpu_logs; at its default level one static profile writes hundreds of MB of
    ERROR lines. The compile workers log fatal lines only unless the user set TPU_MIN_LOG_LEVEL."""
    from tpudiag.capture.tpu_compile import _env

    monkeypatch.delenv("TPU_MIN_LOG_LEVEL", raising=False)
    assert _env(tmp_path, tmp_path, static=True)["TPU_MIN_LOG_LEVEL"] == "3"
    monkeypatch.setenv("TPU_MIN_LOG_LEVEL", "0")  # a user debugging libtpu keeps every line
    assert _env(tmp_path, tmp_path, static=True)["TPU_MIN_LOG_LEVEL"] == "0"
