"""Compiling what matters: `--function`/`--module` pick modules by name or number, and setup modules
(no matmul, kernel, sort, scatter or collective; small arguments), where compiled (`profile --target`),
are compiled together in one worker without the static profile. Real modules dumped by jax from
fixture programs, real compiles."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ARTIFACTS
from tpudiag.capture.compile_cache import CompileCache
from tpudiag.capture.select import Selection, pick
from tpudiag.capture.tpu_compile import (Limits, ModuleCompile, ModuleInput, ModuleStarted, compile_limit_s,
                                         compile_modules)
from tpudiag.errors import InputError
from tpudiag.parse.setup_modules import is_setup_module

DECODER_IR = sorted((ARTIFACTS / "decoder" / "ir").glob("*.mlir"))
NAMES = ["jit_stage", "jit__normal", "jit__normal", "jit_train_step", "jit__mean"]


def test_a_function_is_its_jit_module_and_an_index_tells_equal_names_apart():
    assert pick(NAMES, Selection(), "run") == [0, 1, 2, 3, 4]
    assert pick(NAMES, Selection(functions=("train_step",)), "run") == [3]
    assert pick(NAMES, Selection(modules=("2",)), "run") == [2]
    assert pick(NAMES, Selection(modules=("jit__normal",)), "run") == [1, 2]
    assert pick(NAMES, Selection(modules=("normal",)), "run") == [1, 2], "a part of a name, when none is it whole"
    assert pick(NAMES, Selection(functions=("train_step",), modules=("0",)), "run") == [0, 3]
    # Numbers are the run's, not positions: a run that compiled 01 and 03 only.
    assert pick(["jit__normal", "jit_train_step"], Selection(modules=("3",)), "run", [1, 3]) == [1]


@pytest.mark.parametrize("sel, needle", [
    (Selection(functions=("trian_step",)), "no module for function 'trian_step'"),
    (Selection(modules=("9",)), "no module numbered 9"),
    (Selection(modules=("adam",)), "no module named like 'adam'"),
])
def test_a_selection_that_picks_nothing_lists_the_modules(sel, needle):
    with pytest.raises(InputError) as e:
        pick(NAMES, sel, "RUN")
    assert str(e.value).startswith(f"RUN: {needle}") and "00 jit_stage, 01 jit__normal, 02 jit__normal" in str(e.value)


def test_setup_modules_are_told_from_work_by_their_ops_and_arguments():
    flags = [is_setup_module(p) for p in DECODER_IR]
    assert flags[:3] == [True, True, True], "device_put, threefry seed, the RNG setup (a 5-trip while loop)"
    assert flags[3:] == [False] * (len(DECODER_IR) - 3), "the training step has matmuls"
    # HLO text too: transformers' Flax sampler sorts (no matmul), the decoder's RNG setup does not.
    sampler = ARTIFACTS / "corpus_flax_sampler" / "modules" / "06-jit_sample" / "optimized.hlo.txt"
    assert " sort(" in sampler.read_text() and not is_setup_module(sampler)
    (rng,) = (ARTIFACTS / "decoder" / "hlo").glob("*jit_make_inputs.cpu_after_optimizations.txt")
    assert is_setup_module(rng)


def test_the_compile_limit_scales_with_matmuls_unless_given():
    setup, step = DECODER_IR[2], DECODER_IR[-1]
    assert compile_limit_s(setup, Limits()) == Limits().compile_base_s
    assert compile_limit_s(step, Limits()) > Limits().compile_base_s
    assert compile_limit_s(step, Limits(compile_timeout_s=42)) == 42


def test_setup_modules_compile_together_and_the_step_alone(tmp_path):
    inputs = [ModuleInput(p.stem, p, "mlir") for p in DECODER_IR]
    events = []
    cache = CompileCache(tmp_path / "cache")
    results = compile_modules(inputs, tmp_path / "m", "v5e:2x2", static_profile=False, jobs=2, cache=cache,
                              progress=events.append)
    starts = [e.name for e in events if isinstance(e, ModuleStarted)]
    assert sorted(starts) == sorted(["3 setup module(s)", inputs[3].name]), starts
    assert sorted(e.name for e in events if isinstance(e, ModuleCompile)) == sorted(i.name for i in inputs)
    assert [r.setup for r in results] == [True, True, True, False]
    assert [r.dir.name[:2] for r in results] == ["00", "01", "02", "03"]
    for r in results:
        assert r.status == "ok" and r.static_profile == "off" and r.result["compile_s"] > 0
        assert (r.dir / "optimized.hlo.txt").is_file()
        assert json.loads((r.dir / "module.json").read_text())["setup"] is r.setup
    # Compiled in one process: one log, the same in each setup module's directory.
    logs = {(r.dir / "compile.log").read_text() for r in results[:3]}
    assert len(logs) == 1 and all(f"== {r.dir / 'input.mlir'}" in next(iter(logs)) for r in results[:3])
    # A second compile of the same modules comes from the compile cache, setup modules included.
    again = compile_modules(inputs, tmp_path / "n", "v5e:2x2", static_profile=False, jobs=2, cache=cache)
    assert all(r.cached for r in again) and [r.setup for r in again] == [True, True, True, False]
    assert [r.result for r in again] == [r.result for r in results]
