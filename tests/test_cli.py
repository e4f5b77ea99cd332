"""CLI behaviour through click's CliRunner: options, bad input, exit codes, one-line errors."""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACTS, xplane_of
from tpudiag.cli import cli, main


def run_main(args, capsys):
    """Invoke `main()` (which maps errors to exit codes) and capture its output."""
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_help_lists_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "profile" in result.output and "report" in result.output


def test_report_of_a_bare_xplane_uses_its_run(in_root):
    result = CliRunner().invoke(cli, ["report", "--json", str(xplane_of("mlp"))])
    doc = json.loads(result.output)
    assert doc["program"] == "fixtures/programs/mlp.py"
    assert all(o["category"] != "unknown" for o in doc["ops"])


def test_report_of_an_xplane_outside_a_run(tmp_path):
    lone = tmp_path / "host.xplane.pb"
    shutil.copy(xplane_of("mlp"), lone)
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", str(lone)]).output)
    assert doc["backend"] == "cpu" and doc["ops"]
    assert doc["program"] is None
    assert any("no HLO dump" in w for w in doc["warnings"])
    # Without jax.monitoring data, compilation is still recognised from the compiler's own trace events.
    assert doc["breakdown"]["compile_s"] > doc["breakdown"]["host_s"]


@pytest.mark.parametrize("setup,needle,code", [
    ("empty_dir", "empty directory", 2),
    ("missing", "no such file", 2),
    ("truncated", "corrupt or truncated", 3),
    ("zero", "empty file", 3),
    ("bad_manifest", "not valid JSON", 3),
])
def test_report_bad_input_is_one_line(tmp_path, capsys, setup, needle, code):
    target = tmp_path / "t"
    if setup == "empty_dir":
        target.mkdir()
    elif setup == "truncated":
        target = tmp_path / "t.xplane.pb"
        target.write_bytes(xplane_of("mlp").read_bytes()[:2000])
    elif setup == "zero":
        target = tmp_path / "t.xplane.pb"
        target.write_bytes(b"")
    elif setup == "bad_manifest":
        shutil.copytree(ARTIFACTS / "mlp", target)
        (target / "manifest.json").write_text("{not json")
    rc, out, err = run_main(["report", str(target)], capsys)
    assert rc == code
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(target.name) in lines[0]
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="no such file"):
        main(["--debug", "report", str(tmp_path / "missing")])


def test_json_and_md_together_is_a_usage_error(capsys):
    rc, out, err = run_main(["report", "--json", "--md", str(ARTIFACTS / "mlp")], capsys)
    assert rc == 2 and "choose one" in err


def test_profile_missing_script(tmp_path, capsys):
    rc, out, err = run_main(["profile", "--out", str(tmp_path / "r"), str(tmp_path / "nope.py")], capsys)
    assert rc == 2 and "nope.py: no such file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists(), "nothing half-written"


def test_profile_never_overwrites_a_run(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    rc, _, err = run_main(["profile", "--out", str(run), str(ARTIFACTS.parent / "programs" / "mlp.py")], capsys)
    assert rc == 2 and "never overwrites" in err
    assert (run / "manifest.json").read_text() == "{}"


def test_skip_needs_steps(tmp_path, capsys):
    rc, _, err = run_main(["profile", "--skip", "1", str(ARTIFACTS.parent / "programs" / "mlp.py")], capsys)
    assert rc == 2 and "--skip needs --steps" in err

def test_profile_ci_writes_the_bundle_and_prints_its_path(tmp_path, capsys):
    run = tmp_path / "ci"
    rc, out, err = run_main(["profile", "--ci", "--json", "--out", str(run),
                             str(ARTIFACTS.parent / "programs" / "mlp.py"), "--", "--steps", "3"], capsys)
    assert rc == 0 and json.loads(out)["schema"] == "tpudiag.report/1"  # stdout is still only the report
    bundle = run / "tpudiag-artifacts.tar.gz"
    assert f"tpudiag: CI artifacts {bundle} (" in err
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert names[:4] == ["ci/manifest.json", "ci/report.json", "ci/report.md", "ci/report.html"]
    assert names[-1] == "ci/BUNDLE.txt"
    assert any(n.endswith(".xplane.pb") for n in names)


def test_profile_ci_of_a_failing_program_bundles_and_keeps_its_exit_code(tmp_path, capsys):
    run = tmp_path / "ci"
    rc, _, err = run_main(["profile", "--ci", "--md", "--out", str(run),
                           str(ARTIFACTS.parent / "programs" / "failing" / "raises.py")], capsys)
    assert rc == 1 and (run / "tpudiag-artifacts.tar.gz").is_file() and "tpudiag: CI artifacts" in err


def test_max_artifact_mb_needs_ci_and_room_for_the_reports(tmp_path, capsys):
    mlp = str(ARTIFACTS.parent / "programs" / "mlp.py")
    rc, _, err = run_main(["profile", "--max-artifact-mb", "5", mlp], capsys)
    assert rc == 2 and err.strip() == "tpudiag: error: --max-artifact-mb needs --ci"
    rc, _, err = run_main(["compile", "--target", "v5e", "--max-artifact-mb", "5", mlp], capsys)
    assert rc == 2 and err.strip() == "tpudiag: error: --max-artifact-mb needs --ci"
    run = tmp_path / "r"
    rc, _, err = run_main(["profile", "--ci", "--max-artifact-mb", "0.001", "--out", str(run), mlp], capsys)
    assert rc == 2 and "too small for the reports alone" in err.splitlines()[-1]
    assert (run / "report.json").is_file() and not list(run.glob("tpudiag-artifacts.tar.gz*"))


@pytest.mark.parametrize("command,typo,close", [
    (["profile"], "--stpes", "--steps"),
    (["compile", "--target", "v5e"], "--no-static-profle", "--no-static-profile"),
])
def test_an_unknown_option_before_the_script_is_no_such_option(tmp_path, capsys, command, typo, close):
    rc, out, err = run_main([*command, "--out", str(tmp_path / "r"), typo, "1", "s.py"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"tpudiag: error: no such option: {typo} (did you mean {close}? tpudiag's options: ")
    assert "--out" in err and "the program's own options go after the script and --" in err
    assert "no such file" not in err and not (tmp_path / "r").exists()


def test_options_after_the_script_still_go_to_the_program(tmp_path, capsys):
    """`--bogus` after SCRIPT is the program's: mlp.py's argparse refuses it, with its own exit code."""
    run = tmp_path / "r"
    rc, _, err = run_main(["profile", "--out", str(run), "--md", str(ARTIFACTS.parent / "programs" / "mlp.py"),
                           "--bogus"], capsys)
    assert rc == 2 and "the program failed" in err and "no such option" not in err
    assert "unrecognized arguments: --bogus" in (run / "program.log").read_text()


@pytest.mark.parametrize("remove", ["trace", "xplane"])
def test_report_of_a_run_whose_trace_was_deleted_says_so(tmp_path, remove):
    run = tmp_path / "mlp"
    shutil.copytree(ARTIFACTS / "mlp", run)
    if remove == "trace":
        shutil.rmtree(run / "trace")
        missing = f"the trace is missing: {run / 'trace'} is gone; manifest.json lists 1 trace file(s) in it"
    else:
        (listed,) = json.loads((run / "manifest.json").read_text())["xplanes"]
        (run / listed).unlink()
        missing = f"the trace is missing: {run / listed} (listed in manifest.json) is gone"
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", str(run)]).output)
    assert doc["status"] == "ok", "the status stays the manifest's"
    assert doc["warnings"] == [missing] and doc["reason"] == missing
    assert not any("step" in w for w in doc["warnings"])
    text = CliRunner().invoke(cli, ["report", "--no-color", "--width", "400", str(run)]).output
    header = text.split("╰")[0]
    assert "status ok (the trace is missing: " in " ".join(header.split())


def _module_events(tmp_path):
    """What the compile pipeline emits (capture/tpu_compile.py): a module started and finished, one
    copied from the compile cache (no start), one that failed."""
    from tpudiag.capture.tpu_compile import ModuleCompile, ModuleStarted

    done = dict(dir=tmp_path, error=None, static_profile="ok", result={})
    return [ModuleStarted(name="jit_train_step", static_limit_s=60.0, cpu_s=lambda: 1.0),
            ModuleCompile(name="jit_train_step", status="ok", **done),
            ModuleCompile(name="jit_stage", status="ok", cached="v5e-1234", **done),
            ModuleStarted(name="jit_step", static_limit_s=None, cpu_s=lambda: 0.0),
            ModuleCompile(name="jit_step", status="failed", **{**done, "error": "INVALID_ARGUMENT: bad\nsecond line",
                                                               "static_profile": "off"})]


def test_compile_progress_is_a_plain_line_per_module_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """Piped or in CI: nothing while a script may still be printing (`None`), then each module's
    name, status and seconds on stderr as it finishes; stdout stays the report's."""
    import re

    from tpudiag.cli.common import progress

    on_module, stop = progress()
    on_module(None)
    assert capsys.readouterr() == ("", "")
    for ev in _module_events(tmp_path):
        on_module(ev)
    stop()
    out, err = capsys.readouterr()
    assert out == ""
    first, cached, failed = err.splitlines()
    assert re.fullmatch(r"tpudiag: module jit_train_step: ok, \d+\.\d s", first), first
    assert cached == "tpudiag: module jit_stage: ok, from the compile cache"
    assert re.fullmatch(r"tpudiag: module jit_step: failed, \d+\.\d s: INVALID_ARGUMENT: bad\\nsecond line", failed)


def test_compile_progress_times_the_setup_group_its_modules_compiled_in(tmp_path, capsys):
    """Setup modules compile together in one worker (`tpu_compile.compile_setup_group`): one start
    for the group, then each module's end; each line has the group's seconds."""
    import re

    from tpudiag.capture.tpu_compile import ModuleCompile, ModuleStarted
    from tpudiag.cli.common import progress

    on_module, stop = progress()
    on_module(ModuleStarted(name="2 setup module(s)", static_limit_s=None, cpu_s=lambda: 0.0))
    for name in ("jit_stage", "jit__threefry_seed"):
        on_module(ModuleCompile(name=name, dir=tmp_path, status="ok", error=None, static_profile="off", result={},
                                setup=True))
    stop()
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r"\d+\.\d s", "T", ln) for ln in lines] == [
        "tpudiag: module jit_stage: ok, T (with the setup group)",
        "tpudiag: module jit__threefry_seed: ok, T (with the setup group)"]


def test_compile_progress_on_a_terminal_waits_for_the_first_module(tmp_path, capsys, monkeypatch):
    """The transient line starts with the first module, never while the script prints (it ran
    into the program's output: `… 0 module(s) donemlp_bf16: loss=0.41115`)."""
    from tpudiag.cli.common import progress

    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes stderr for a terminal
    on_module, stop = progress()
    on_module(None)
    assert capsys.readouterr() == ("", ""), "nothing on the terminal while the script runs"
    on_module(_module_events(tmp_path)[0])
    stop()
    out, err = capsys.readouterr()
    assert out == "" and "compiling for TPU: 0 module(s) done; jit_train_step: static profile" in err
