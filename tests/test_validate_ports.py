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


def test_a_top_p_cut_within_the_cumulative_sum_s_rounding_is_a_tie():
    """`tiny` logits over a 32,000 vocabulary make the probabilities near-equal: where the nucleus
    ends rests on a float32 sum of ~3,200 of them, and a port summing in XLA's order keeps one token
    float64 does not. Moving the inputs by a few eps leaves that sum where it was; moving every sum
    of the reference's float64 run by its own rounding bound (n x eps x sum|terms|, float32's eps)
    shows the cut is a tie there. Outside the ties the port must still agree, and the planted twin
    and transformers' bf16 Flax warper still fail (above)."""
    res = tpudiag.validate(f"{REF}:top_p_mask", f"{PORT}:top_p_mask_torch_steps", "logits=f32[8,32000]",
                           regimes="tiny,normal", seed=5, shrink=False)
    assert res.ok, res.summary()
    for case in res.cases:
        (check,) = [c for c in case.checks if c.what == "candidate vs float64"]
        assert "sums' rounding error" in check.detail and check.detail.endswith("differ")
        ties, n = (int(x) for x in check.detail.split(" position(s)")[0].split(" of "))
        assert 0 < ties < n // 20  # the band around each row's cut, not the row


def test_a_bf16_gradient_is_allowed_what_the_reference_loses_computed_in_bf16():
    """JAX differentiates `weight * normed` in bf16: the weight's gradient is a bf16 reduce_sum over
    all 128 rows, which XLA's CPU accumulates in bf16, where PyTorch's autograd accumulates in
    float32. Against the reference's own 2x + 1 ULP that failed 6 of 9 regimes by a few percent (seed
    5). The reference's bf16 twin (its float32 statistics in bf16 too, differentiated there) loses
    a comparable amount, and that is allowed on top."""
    res = tpudiag.validate(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", "x=bf16[2,64,1024] weight=bf16[1024]", grad=True,
                           regimes="all", seed=5, shrink=False)
    assert res.ok, res.summary()
    for case in res.cases:
        twin = {m.what: m.stats for m in case.measures}["grad[weight] reference in bfloat16 vs float64"]
        assert twin.normwise > 0 and twin.ulp_mean > 0
        (check,) = [c for c in case.checks if c.what == "grad[weight] candidate vs float64"]
        assert "+ its bfloat16 twin's" in check.rule
    # values keep the rule as it was: a twin of the forward would excuse a bf16 accumulation the
    # reference does not make (the planted bf16 sums of tests/test_validate.py)
    assert not any("twin" in c.rule for case in res.cases for c in case.checks if not c.what.startswith("grad"))


def test_a_bf16_gradient_is_allowed_what_its_own_16_bit_sums_lose():
    """At 512 rows the weight's gradient is a bf16 sum XLA's CPU rounds after every add, where the
    reference's bf16 twin (torch) adds in float32: its allowance no longer covers the port's loss
    (3 of 9 regimes failed the mean-ULP rule by up to 4%, seed 5). The candidate's gradient with
    its 16-bit sums added in float32 measures that loss, allowed on top; the planted twin's bf16
    gradient still fails where its formula is wrong."""
    spec = "x=bf16[4,128,512] weight=bf16[512]"
    res = tpudiag.validate(f"{REF}:rmsnorm", f"{PORT}:rmsnorm", spec, grad=True, regimes="all", seed=5,
                           shrink=False)
    assert res.ok, res.summary()
    for case in res.cases:
        (check,) = [c for c in case.checks if c.what == "grad[weight] candidate vs float64"]
        assert check.rule.endswith("+ its 16-bit sums'")
        sums = {m.what: m.stats for m in case.measures}["grad[weight] candidate vs itself with float32 sums"]
        assert sums.normwise > 0
    twin = tpudiag.validate(f"{REF}:rmsnorm", f"{PORT}:rmsnorm_eps_outside", spec, grad=True, regimes="tiny",
                            seed=5, shrink=False)
    assert not twin.ok and "first at" in twin.failures[0].why
