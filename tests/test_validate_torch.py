"""`validate` with PyTorch references written as serving engines write them (fixtures/programs/
parity/torch_refs.py: explicit float32 casts, in-place updates) against correct JAX ports: the
float64 run is truly float64, the ports pass in f32 and bf16 with their gradients, a planted twin
fails; plus how inputs bind to the two sides, how a side that raises is reported, the jitted
candidate, and the size guard. torch is installed on the oldest jax leg only (the CPU build on
disk for Python 3.11); the tests that need it skip elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import tpudiag
from tests.conftest import PROGRAMS
from tpudiag.errors import InputError

P = PROGRAMS / "parity"
REF, PORT = f"{P}/torch_refs.py", f"{P}/torch_ports.py"


def _v(ref, cand, inputs, **kw):
    kw.setdefault("seed", 3)
    return tpudiag.validate(ref, cand, inputs, **kw)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _measure(res, what):
    return [m for c in res.cases for m in c.measures if m.what == what]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_correct_rotary_port_passes_against_a_reference_that_casts_to_float32(torch, dtype):
    res = _v(f"{REF}:rotary_half", f"{PORT}:rotary_half", f"x={dtype}[64,4,64]", grad=True, regimes="all")
    assert res.ok, res.summary()
    # the reference's own error against float64 is measured, not zero: its float32 tables were promoted
    own = [m.stats.normwise for m in _measure(res, "reference vs float64")]
    assert own and min(own) > 0
    notes = [m.detail for m in _measure(res, "float64 run")]
    assert notes and "dtype= of arange float32" in notes[0] and ".float()" in notes[0]


def test_the_planted_rotary_twin_fails_naming_the_element(torch):
    res = _v(f"{REF}:rotary_half", f"{PORT}:rotary_half_sign_flipped", "x=f32[64,4,64]", shrink=False)
    assert not res.ok
    (case,) = res.failures
    assert case.regime == "normal" and "first at" in case.why


def test_an_in_place_reference_works_with_its_gradient(torch):
    res = _v(f"{REF}:temperature_log_softmax", f"{PORT}:temperature_log_softmax", "logits=f32[8,1000]",
             grad=True, regimes="normal,offset,large_logits")
    assert res.ok, res.summary()


def test_a_reference_outside_torch_s_functions_is_said_to_be_understated(torch):
    res = _v(f"{REF}:through_numpy", f"{PORT}:exp", "x=f32[16,128]")
    notes = " ".join(m.detail for m in _measure(res, "float64 run"))
    assert "bit-identical to the working-precision run" in notes and "still came back in torch.float32" in notes


def test_inputs_bind_by_name_to_both_sides_or_say_why_not(torch):
    spec = "x=bf16[16,1024] w=bf16[1024]"
    with pytest.raises(InputError, match=r"the reference takes \(x, weight\), the candidate takes \(inp, weight\)"):
        _v(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", "x=bf16[16,1024] weight=bf16[1024]")
    with pytest.raises(InputError, match="do not match"):
        _v(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", spec)
    res = _v(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", "x=bf16[16,1024] weight=bf16[1024]", bind="x=inp")
    assert res.ok, res.summary()
    with pytest.raises(InputError, match=r"--bind wt=weight: no input is named 'wt'"):
        _v(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", "x=bf16[16,1024] weight=bf16[1024]", bind="x=inp wt=weight")
    with pytest.raises(InputError, match=r"has no parameter 'inpt'"):
        _v(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", "x=bf16[16,1024] weight=bf16[1024]", bind="x=inpt")


def _ref_that_overflows(x):
    if np.abs(x).max() > 100:
        raise OverflowError("this reference takes logits below 100")
    return np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)


def test_a_reference_that_raises_in_one_regime_is_that_regime_s_error():
    import jax

    res = tpudiag.validate(_ref_that_overflows, lambda x: jax.nn.softmax(x, axis=-1), "x=f32[8,256]",
                           regimes="normal,large_logits", seed=1)
    by = {c.regime: c for c in res.cases}
    assert by["normal"].ok  # its verdict stands
    assert not by["large_logits"].ok and by["large_logits"].error.startswith("the reference")
    assert "OverflowError" in by["large_logits"].error and "x=float32[8,256]" in by["large_logits"].error


def test_odd_lengths_keeps_a_size_that_is_also_a_feature_dimension():
    import jax

    # sequence 64 = head_dim 64: shortening one would shorten both
    res = tpudiag.validate(lambda x: np.asarray(x, np.float64) * 2, lambda x: x * 2, "x=f32[2,64,4,64]",
                           regimes="normal,odd_lengths", seed=1)
    assert res.ok and "odd_lengths" in res.skipped and any("no length dimension" in n for n in res.notes)
    res = tpudiag.validate(lambda x: np.asarray(x, np.float64) * 2, lambda x: x * 2, "x=f32[2,128,4,64]",
                           regimes="odd_lengths", seed=1)
    assert res.ok and res.cases[0].inputs == "x=float32[2,125,4,64]"
    del jax


def test_the_candidate_is_checked_jitted_unless_eager():
    spec = "x=f32[8,64]"
    res = _v(f"{P}/refs.py:softmax", f"{PORT}:concrete_scale", spec, shrink=False)
    assert not res.ok and res.cases[0].error.startswith("the candidate")  # it cannot run under jit
    ref = lambda x: np.asarray(x, np.float64) / np.abs(np.asarray(x, np.float64)).max()  # noqa: E731
    assert _v(ref, f"{PORT}:concrete_scale", spec, eager=True).ok


def test_an_input_too_large_for_memory_is_refused_before_allocation():
    with pytest.raises(InputError, match=r"x=bfloat16\[100000,100000\] alone is 10,000,000,000 elements"):
        _v(f"{P}/refs.py:softmax", f"{P}/ports.py:softmax", "x=bf16[100000,100000]")
