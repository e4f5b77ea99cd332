"""Setup modules (parse/setup_modules.py: random-number setup, eager initializers, staging) are told
apart from a program's work by one rule, left out of a script's TPU compile with a line that names
them, and given one line instead of a section in the compile and profile reports. Real dumps of the
fixture programs and a real compile of fixtures/programs/decoder.py."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.conftest import ARTIFACTS, PROGRAMS
from tpudiag.cli import cli
from tpudiag.parse.hlo import find_unoptimized_modules
from tpudiag.parse.setup_modules import SETUP_ARGUMENT_BYTES, argument_bytes, is_setup_module


def _unoptimized(run: str) -> dict[str, bool]:
    return {p.name.split(".")[1]: is_setup_module(p)
            for _, p in sorted(find_unoptimized_modules(ARTIFACTS / run / "hlo").items())}


def test_a_sharding_annotation_is_not_a_kernel():
    """XLA's HLO of an eager `jax.random.normal` holds a `Sharding` custom call on its key: still setup."""
    (normal,) = (ARTIFACTS / "collective" / "hlo").glob("*jit__normal.before_optimizations.txt")
    assert 'custom_call_target="Sharding"' in normal.read_text()
    assert _unoptimized("collective") == {
        "jit_stage": True, "jit__threefry_seed": True, "jit__threefry_split": True, "jit_unstack": True,
        "jit__normal": True, "jit_sqrt": True, "jit_true_divide": True, "jit__multi_slice": True,
        "jit_step": False}


def test_the_rule_reads_stablehlo_and_hlo_alike():
    """The decoder's JAX IR (what a compile reads) and XLA's CPU dump (what a profile reads) agree."""
    ir = {p.name.split("_", 2)[2].removesuffix("_compile.mlir"): is_setup_module(p)
          for p in sorted((ARTIFACTS / "decoder" / "ir").glob("*.mlir"))}
    assert ir == _unoptimized("decoder") == {"jit_stage": True, "jit__threefry_seed": True,
                                             "jit_make_inputs": True, "jit_train_step": False}
    # The RNG setup writes far more than it reads: its few bytes of arguments are what count.
    (rng,) = (ARTIFACTS / "decoder" / "ir").glob("*jit_make_inputs*.mlir")
    assert argument_bytes(rng.read_bytes()) <= SETUP_ARGUMENT_BYTES


def test_a_profile_names_its_setup_modules_on_one_line_and_summarizes_the_rest(in_root):
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", "fixtures/artifacts/decoder"]).output)
    assert doc["fusions_setup"] == ["jit_make_inputs", "jit__threefry_seed", "jit_stage"]
    assert [f["module"] for f in doc["fusions"]] == ["jit_train_step"]
    text = CliRunner().invoke(cli, ["report", "--no-color", "--width", "200", "fixtures/artifacts/decoder"]).output
    (line,) = [ln for ln in text.splitlines() if "jit_make_inputs" in ln and "setup" in ln]
    assert line.startswith("setup modules, not summarized (")
    assert "0 fusion breaks" not in text


def test_a_program_that_is_all_setup_sets_none_apart(in_root):
    """fixtures/programs/raises.py computes on 128 floats: every module is setup, so none is set
    apart; a module with no fusion break gets no line."""
    assert set(_unoptimized("raises").values()) == {True}
    doc = json.loads(CliRunner().invoke(cli, ["report", "--json", "fixtures/artifacts/raises"]).output)
    assert "fusions_setup" not in doc
    assert "jit__threefry_seed" in [f["module"] for f in doc["fusions"]], "it has a summary, no fusion break"
    text = CliRunner().invoke(cli, ["report", "--no-color", "--width", "200", "fixtures/artifacts/raises"]).output
    assert "jit__threefry_seed:" not in text and "0 fusion breaks" not in text


def test_a_script_compile_leaves_its_setup_modules_out_and_says_which(tmp_path):
    run = tmp_path / "run"
    args = ["compile", "--target", "v5e", "--no-static-profile", "--no-cache", "--no-color", "--width", "200",
            "--out", str(run), str(PROGRAMS / "decoder.py"), "--", "--steps", "1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert [d.name for d in (run / "modules").iterdir()] == ["03-jit_train_step"]
    skipped = "00-jit_stage, 01-jit__threefry_seed, 02-jit_make_inputs"
    line = (f"3 setup module(s) not compiled (no matmul, kernel, sort, scatter or collective; at most 16 MiB of "
            f"arguments; --each-module compiles them): {skipped}")
    assert line in result.output
    doc = json.loads((run / "report.json").read_text())
    assert doc["source"]["setup_skipped"]["modules"] == skipped.split(", ")
    assert [m["name"] for m in doc["modules"]] == ["jit_train_step"] and doc["status"] == "ok"
    # Re-rendered from the run directory, the report still says what was left out.
    again = CliRunner().invoke(cli, ["report", "--no-color", "--width", "200", str(run)])
    assert again.exit_code == 0 and line in again.output
