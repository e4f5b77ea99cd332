"""Bad input is refused before any work, through the real command line: exit 2, one line on stderr
that names the path and the problem, no traceback, and nothing written (no run directory, no
output file replaced). Covers output paths a file system refuses although `os.access` allows
them, modules XLA's or MLIR's own parser rejects, an estimate's FUNC that is missing, not callable
or has the wrong signature, and single-file outputs (--html, --perfetto, --junit) that exist or
have the wrong extension."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ARTIFACTS, PROGRAMS, file_tree, run_main

MLP = str(PROGRAMS / "mlp.py")
RUN = str(ARTIFACTS / "mlp")


def _refused(rc, out, err, line: str) -> None:
    """Exit 2, nothing on stdout, and exactly `tpudiag: error: <line>` on stderr."""
    assert (rc, out) == (2, ""), err
    assert err == f"tpudiag: error: {line}\n"


# ------------------------------------------------------------------ a directory the file system refuses


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", [["profile"], ["compile", "--target", "v5e"]])
def test_run_directory_in_a_pseudo_file_system_is_one_line(tmp_path, capsys, command):
    """Root may "write" /proc by its modes (os.access says yes), but nothing can be created there:
    the probe asks the file system. The script never runs."""
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    rc, out, err = run_main([*command, "--out", "/proc/tpudiag-run", str(script)], capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("tpudiag: error: /proc/tpudiag-run: ")
    assert not marker.exists() and not os.path.exists("/proc/tpudiag-run")
    assert file_tree(tmp_path) == ["s.py"]


# ------------------------------------------------------------------ modules the parsers reject


_BAD_MLIR = """module {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = stablehlo.addd %x, %x : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
"""
_BAD_HLO = """HloModule bad

ENTRY main {
  p = f32[4] parameter(0)
  ROOT a = f32[4] addd(p, p)
}
"""


@pytest.mark.parametrize("name,data,line", [
    ("garbage.mlir", _BAD_MLIR, "{p}:3:10: not a valid StableHLO module: custom op 'stablehlo.addd' is unknown "
                                "(MLIR parser)"),
    ("garbage.mlirbc", b"ML\xefR\x00garbage",
     "{p}: not a valid StableHLO module: attempting to parse 8 bytes when only 7 remain (MLIR parser)"),
    ("garbage.hlo", _BAD_HLO, "{p}:5:19: not a valid HLO module: expects opcode but sees: addd; Unknown opcode: addd "
                              "(XLA's HLO parser)"),
])
def test_a_module_the_parser_rejects_is_refused_before_the_run(tmp_path, capsys, name, data, line):
    """The parsers the compile worker uses, run here first: the parser's first message, where it
    stopped, the file; no run directory (before: exit 1 and the message in modules/00-*/compile.log)."""
    bad = tmp_path / name
    bad.write_bytes(data) if isinstance(data, bytes) else bad.write_text(data)
    rc, out, err = run_main(["compile", "--target", "v5e", "--out", str(tmp_path / "run"), str(bad)], capsys)
    _refused(rc, out, err, line.format(p=bad))
    assert file_tree(tmp_path) == [name]


def test_a_bad_module_in_an_ir_dump_directory_is_named(tmp_path, capsys):
    dump = tmp_path / "ir"
    dump.mkdir()
    good = next((ARTIFACTS / "mlp" / "ir").glob("*jit_train_step*.mlir"))
    (dump / good.name).write_bytes(good.read_bytes())
    (dump / "jax_ir0009_jit_broken.mlir").write_text(_BAD_MLIR)
    rc, out, err = run_main(["compile", "--target", "v5e", "--out", str(tmp_path / "run"), str(dump)], capsys)
    _refused(rc, out, err, f"{dump / 'jax_ir0009_jit_broken.mlir'}:3:10: not a valid StableHLO module: custom op "
                           "'stablehlo.addd' is unknown (MLIR parser)")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ estimate: FUNC checked before the run


_ENTRIES = """def step(argv, mesh):
    return {}

def make(config, argv, mesh):
    return {}

steps = 3
"""


@pytest.mark.parametrize("func,line", [
    ("stepp", "{f}: no function 'stepp' (did you mean 'step'? defined: make, step)"),
    ("make", "{f}: make(config, argv, mesh) cannot be called as make(argv, mesh): missing a required argument: "
             "'mesh'"),
    ("steps", "{f}: steps is not a function (int value); estimate calls steps(argv, mesh)"),
])
def test_estimate_refuses_a_bad_func_before_any_directory(tmp_path, func, line):
    """FUNC is looked up and its signature checked by the worker, which lowers into a temporary
    directory: neither the run directory nor that temporary directory is left behind."""
    src = tmp_path / "entries.py"
    src.write_text(_ENTRIES)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, "-m", "tpudiag", "estimate", "--target", "v5e:2x2", "--out",
                        str(tmp_path / "run"), f"{src}:{func}"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, TMPDIR=str(tmp), JAX_PLATFORMS="cpu"))
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr[-2000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("tpudiag: error:")]
    assert errors == [f"tpudiag: error: {line.format(f=src)}"]
    assert file_tree(tmp_path) == ["entries.py", "tmp"], "no run directory, no lowering left in the temporary directory"


# ------------------------------------------------------------------ single-file outputs


def _keep(tmp_path, name: str) -> tuple:
    f = tmp_path / name
    f.write_text("print('my own code')\n")
    return f, f.read_text()


@pytest.mark.parametrize("command,option,good", [
    (["report", RUN], "--html", "r.html"),
    (["hlo-diff", RUN, RUN], "--html", "d.html"),
    (["export", RUN], "--perfetto", "t.json"),
    (["profile", MLP], "--html", "p.html"),
    (["compile", "--target", "v5e", MLP], "--html", "c.html"),
    (["kernels", "verify", "rmsnorm"], "--junit", "k.xml"),
    (["validate", "--inputs", "x=f32[4,8]", "refs.py:softmax", "ports.py:softmax"], "--junit", "v.xml"),
])
def test_an_existing_file_or_a_wrong_extension_is_refused(tmp_path, capsys, monkeypatch, command, option, good):
    """A Python source given as the output is never replaced: its extension is refused; a file of
    the right kind that exists is refused too, unless --force. Before any work: no run directory,
    no program run."""
    monkeypatch.chdir(tmp_path)  # where a default run directory (tpudiag-runs/) would appear
    src, text = _keep(tmp_path, "train.py")
    rc, out, err = run_main([*command, option, str(src)], capsys)
    ext = {"--html": ".html or .htm (the HTML page)", "--perfetto": ".json or .json.gz (the Chrome JSON trace)",
           "--junit": ".xml (the JUnit XML)"}[option]
    _refused(rc, out, err, f"{src}: expected a file name ending in {ext}")
    existing = tmp_path / good
    existing.write_text("an earlier report\n")
    rc, out, err = run_main([*command, option, str(existing)], capsys)
    _refused(rc, out, err, f"{existing}: already exists (--force replaces it; or give another name)")
    assert src.read_text() == text and existing.read_text() == "an earlier report\n"
    assert file_tree(tmp_path) == sorted(["train.py", good])


@pytest.mark.parametrize("command,option,name,head", [
    (["report", RUN], "--html", "r.html", "<!DOCTYPE html>"),
    (["export", RUN], "--perfetto", "t.json.gz", "\x1f\x8b"),
])
def test_force_replaces_an_existing_file(tmp_path, capsys, command, option, name, head):
    out_file = tmp_path / name
    out_file.write_text("an earlier report\n")
    rc, _out, err = run_main([*command, option, str(out_file), "--force"], capsys)
    assert rc == 0, err
    assert out_file.read_bytes().decode("latin-1").startswith(head)


def test_the_checks_run_in_the_installed_command(tmp_path):
    """One real `tpudiag` process: the same line and exit code as through main()."""
    src, text = _keep(tmp_path, "model.py")
    exe = os.path.join(os.path.dirname(sys.executable), "tpudiag")
    p = subprocess.run([exe, "export", RUN, "--perfetto", str(src)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == (f"tpudiag: error: {src}: expected a file name ending in .json or .json.gz "
                        "(the Chrome JSON trace)\n")
    assert src.read_text() == text



def test_an_out_of_range_number_is_one_line(capsys):
    rc, out, err = run_main(["kernels", "bench", "--target", "v5e", "--calls", "0", "rmsnorm"], capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("tpudiag: error: Invalid value for '--calls': 0 is not in the range")
    assert err.rstrip().endswith("(see tpudiag kernels bench --help)")


@pytest.mark.parametrize("args,option,value", [
    (["compile", "--target", "v5e", "--timeout", "nan", RUN], "--timeout", "nan"),
    (["compile", "--target", "v5e", "--static-memory", "inf", RUN], "--static-memory", "inf"),
    (["compile", "--target", "v5e", "--compile-timeout", "nan", RUN], "--compile-timeout", "nan"),
    (["kernels", "bench", "--target", "v5e", "--static-memory", "1e999", "rmsnorm"], "--static-memory", "1e999"),
    (["profile", "--processes", "2", "--process-timeout", "nan", MLP], "--process-timeout", "nan"),
    (["validate", f"{MLP}:forward", f"{MLP}:forward", "--inputs", "x=f32[2]", "--k", "nan"], "--k", "nan"),
    (["validate", f"{MLP}:forward", f"{MLP}:forward", "--inputs", "x=f32[2]", "--floor-eps", "inf"], "--floor-eps",
     "inf"),
])
def test_a_number_that_is_not_finite_is_one_line(tmp_path, capsys, monkeypatch, args, option, value):
    """nan passes every range check: `--timeout nan` was a limit that never fired and `--compile-timeout
    nan` was taken, `--static-memory inf` ended in an internal error (exit 70), `validate --k nan`
    failed a correct port. Now each is refused at the door, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(args, capsys)
    command = " ".join(args[:2]) if args[0] == "kernels" else args[0]
    _refused(rc, out, err, f"Invalid value for '{option}': '{value}' is not a finite number. "
                           f"(see tpudiag {command} --help)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["profile", "nosuch.py"], ["profile", "--steps", "0", MLP],
                                  ["estimate", "--target", "v5e", f"{MLP}:nosuch"],
                                  ["estimate", "--target", "v5e", f"{MLP}:LEARNING_RATE"]])
def test_a_command_refused_after_claiming_its_default_run_directory_leaves_nothing(tmp_path, args):
    """Without --out, the run directory is claimed first (an atomic mkdir, for runs started in the
    same second); a command refused after that (estimate learns of a bad FUNC from its lowering
    worker) left an empty tpudiag-runs/<timestamp>-<name>/ behind. Now nothing is left."""
    p = subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    last = p.stderr.strip().splitlines()[-1]  # (estimate says "lowering ..." first)
    assert p.returncode == 2 and last.startswith("tpudiag: error: ") and "Traceback" not in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_reason_cut_at_a_semicolon_goes_on_to_the_next_line():
    from tpudiag.errors import one_line

    e = RuntimeError("Lowering of StableHLO failed;\n  INTERNAL: the dot's operands differ\n(more)")
    assert one_line(e) == "RuntimeError: Lowering of StableHLO failed; INTERNAL: the dot's operands differ"
    assert one_line(RuntimeError("done.\nnot this")) == "RuntimeError: done."


def test_columns_sets_the_width_of_piped_output_and_the_xprof_hint_is_shell_quoted(tmp_path):
    import shutil

    run = tmp_path / "my run"
    shutil.copytree(ARTIFACTS / "mlp", run)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    wide = subprocess.run([sys.executable, "-m", "tpudiag", "report", str(run)], capture_output=True, text=True,
                          env=env, timeout=120)
    narrow = subprocess.run([sys.executable, "-m", "tpudiag", "report", str(run)], capture_output=True, text=True,
                            env=dict(env, COLUMNS="100"), timeout=120)
    assert wide.returncode == narrow.returncode == 0
    assert max(map(len, wide.stdout.splitlines())) > 100 >= max(map(len, narrow.stdout.splitlines()))
    assert f"xprof --logdir '{run}/trace'" in wide.stdout


def test_a_program_that_reads_a_terminal_is_told_to_pipe_its_input(tmp_path):
    # tpudiag's standard input is a terminal (a pseudo-terminal here): the program gets none, and
    # when it fails on end of input the reason says how to give it some.
    master, slave = os.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", str(tmp_path / "run"),
                            str(PROGRAMS / "reads_stdin.py")], stdin=slave, capture_output=True, text=True,
                           timeout=300)
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 1
    assert "EOFError" in p.stderr and "pipe or redirect its input (tpudiag profile prog.py < FILE)" in p.stderr


def test_a_program_that_traces_nothing_says_so_in_its_box(tmp_path):
    (tmp_path / "empty.py").write_text("")
    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--out", str(tmp_path / "run"),
                        str(tmp_path / "empty.py")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "status ok (the program ran; nothing was traced)" in " ".join(p.stdout.split())
    assert p.stderr.strip().splitlines()[-1].startswith("tpudiag: error: nothing was traced")
