"""`validate` on real port pairs (fixtures/programs/parity/thirdparty/): transformers 4.57.6's
PyTorch code as the reference, called as it ships, against its own Flax code (or a port written
here where it has none), each with a planted twin. Every correct port passes every regime that
applies, in f32 and bf16, with its gradient where it has one; every twin fails, naming the regime
and the first differing element; ties the two sides break differently are excluded, and counted.
torch runs on the oldest leg (its CPU build); these skip elsewhere."""

from __future__ import annotations

import pytest

import tpudiag
from tests.conftest import PROGRAMS

P = PROGRAMS / "parity" / "thirdparty"
REF, PORT = f"{P}/torch_refs.py", f"{P}/flax_ports.py"

# name -> (inputs with {dt} for the dtype, differentiable, the planted twin, extra options)
PAIRS = {
    "rmsnorm": ("x={dt}[16,256] weight={dt}[256]", True, "rmsnorm_eps_outside", {}),  # caught by `tiny`
    "rotary_half": ("x={dt}[2,4,32,64]", True, "rotary_half_as_interleaved", {}),
    "rotary_interleaved": ("x={dt}[2,32,4,64]", True, "rotary_interleaved_as_half", {}),
    "gated_silu": ("gate={dt}[16,256] up={dt}[16,256]", True, "gated_gelu", {}),
    "top_k_mask": ("logits={dt}[8,512]", False, "top_k_mask_off_by_one", {}),
    "top_p_mask": ("logits={dt}[8,512]", False, "top_p_mask_inclusive", {}),
    "temperature_log_softmax": ("logits={dt}[8,512]", True, "temperature_multiplied", {}),
    "moe_router": ("router_logits={dt}[64,8]", False, "moe_router_not_renormalized", {"unordered": -1}),
}


@pytest.fixture(autouse=True)
def _torch():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_correct_port_passes_every_regime(name, dtype):
    spec, diff, _, opts = PAIRS[name]
    res = tpudiag.validate(f"{REF}:{name}", f"{PORT}:{name}", spec.format(dt=dtype), grad=diff, regimes="all",
                           seed=5, shrink=False, **opts)
    assert res.ok, res.summary()
    assert len(res.cases) >= 8


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_planted_twin_fails_naming_the_regime_and_the_element(name):
    spec, _, twin, opts = PAIRS[name]
    regime = "tiny" if name == "rmsnorm" else "normal"  # eps after the sqrt shows where rows are small
    res = tpudiag.validate(f"{REF}:{name}", f"{PORT}:{twin}", spec.format(dt="f32"), regimes=regime, seed=5,
                           shrink=False, **opts)
    assert not res.ok
    (case,) = res.failures
    assert case.regime == regime and "first at" in case.why, case.why


def test_ties_are_excluded_and_counted():
    """The `ties` regime draws five distinct values: the top-8 of 512 logits cuts through a tied
    group, which torch's and Flax's top-k break differently; those positions are the tie, shown with
    their count, and everything else must still agree."""
    res = tpudiag.validate(f"{REF}:top_k_mask", f"{PORT}:top_k_mask", "logits=f32[8,512]", regimes="ties", seed=5)
    (case,) = res.cases
    (check,) = [c for c in case.checks if c.what == "candidate vs float64"]
    assert check.ok and "are ties" in check.detail
    n = int(check.detail.split(" of ")[0])
    assert 0 < n < 8 * 512


def test_transformers_flax_top_p_in_bf16_keeps_another_nucleus():
    """A finding, not a planted bug: transformers' FlaxTopPLogitsWarper given bf16 logits takes the
    softmax and its cumulative sum in bf16, and keeps a different set of tokens than float64 where
    PyTorch's warper (float accumulation) keeps exactly float64's; on f32 logits it passes."""
    res = tpudiag.validate(f"{REF}:top_p_mask", f"{PORT}:top_p_mask_as_shipped", "logits=bf16[8,512]",
                           regimes="normal", seed=5, shrink=False)
    (case,) = res.failures
    assert "differ from the float64 decision (the reference's own run: 0)" in case.why, case.why
