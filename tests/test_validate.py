"""`tpudiag validate`: planted bugs in fixtures/programs/parity/ports.py each caught by the regime that
should catch it, the correct ports passing every regime (a NumPy reference against the bundled
Pallas RMSNorm in interpret mode among them), the float64 yardstick, the statistics against
NumPy's own ULP arithmetic, shrinking, the output forms and the bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import tpudiag
from tests.conftest import PROGRAMS, ROOT
from tpudiag.analyze.numerics import ParityRule, error_stats, parity_check
from tpudiag.results.validate import ValidateResult
from tpudiag.errors import InputError

P = PROGRAMS / "parity"
SOFTMAX = "x=f32[16,1000]"
ATTENTION = "q=bf16[1,2,64,32] k=bf16[1,2,64,32] v=bf16[1,2,64,32]"
RMSNORM = "x=bf16[8,512] w=bf16[512]"


def _v(ref, cand, inputs, **kw):
    kw.setdefault("seed", 7)
    return tpudiag.validate(f"{P}/{ref}", f"{P}/{cand}", inputs, **kw)


# planted bug -> (reference, inputs, options, the regimes that must catch it, the check that fails)
PLANTED = {
    "softmax_no_max": ("refs.py:softmax", SOFTMAX, {}, {"large_logits", "offset"}, "candidate vs float64"),
    "softmax_via_logsumexp": ("refs.py:softmax", SOFTMAX, {}, {"offset", "large_logits"}, "candidate vs float64"),
    "attention_mask_off_by_one": ("refs.py:attention", ATTENTION, {}, {"normal"}, "candidate vs float64"),
    "rmsnorm_eps_outside": ("refs.py:rmsnorm", RMSNORM, {}, {"tiny"}, "candidate vs float64"),
    "row_sum_bf16_acc": ("refs.py:row_sum", "x=bf16[8,4096]", {}, {"normal", "offset"}, "candidate vs float64"),
    "scaled_scores_bad_vjp": ("refs.py:scaled_scores", "q=f32[64,32] k=f32[48,32]", {"grad": True}, {"normal"},
                              "grad[q] candidate vs float64"),
    "softmax_nondeterministic": ("refs.py:softmax", SOFTMAX, {}, {"normal"}, "determinism"),
    # the reference documents lower-index-first ties: held to it with strict_ties (else a tie, excluded)
    "top_k_ties_last": ("refs.py:top_k", "x=f32[8,100]", {"strict_ties": True}, {"ties"},
                        "[1] candidate vs reference"),
    "masked_softmax_nan_rows": ("refs.py:masked_softmax", "x=f32[16,64] mask=bool[16,64] lengths=s32[16]{1..64}", {},
                                {"masked_rows", "bounds"}, "candidate vs float64"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_planted_bug_is_caught_by_its_regime(bug):
    ref, spec, opts, regimes, check = PLANTED[bug]
    res = _v(ref, f"ports.py:{bug}", spec, regimes="all", shrink=False, **opts)
    failed = {c.regime for c in res.failures}
    assert not res.ok and regimes <= failed, res.summary()
    for c in res.cases:
        if c.regime in regimes:
            bad = [k for k in c.checks if not k.ok]
            assert check in {k.what for k in bad}, c.why
    if bug in ("top_k_ties_last", "rmsnorm_eps_outside"):  # only the regime made for it
        assert failed == regimes, res.summary()


# The same ops ported correctly: every regime that applies passes (values, and gradients where asked).
CORRECT = [
    ("refs.py:softmax", "ports.py:softmax", SOFTMAX, {}),
    ("refs.py:softmax", "ports.py:softmax", "x=bf16[16,1000]", {}),
    ("refs.py:attention", "ports.py:attention", ATTENTION, {"grad": True, "static": "causal=True"}),
    ("refs.py:rmsnorm", "ports.py:rmsnorm", RMSNORM, {"grad": True}),
    ("refs.py:row_sum", "ports.py:row_sum", "x=bf16[8,4096]", {}),
    ("refs.py:scaled_scores", "ports.py:scaled_scores", "q=f32[64,32] k=f32[48,32]", {"grad": True}),
    ("refs.py:top_k", "ports.py:top_k", "x=f32[8,100]", {}),
    ("refs.py:masked_softmax", "ports.py:masked_softmax", "x=f32[16,64] mask=bool[16,64] lengths=s32[16]{0..64}", {}),
]


@pytest.mark.parametrize("ref,cand,spec,opts", CORRECT, ids=lambda x: x if isinstance(x, str) else "")
def test_correct_ports_pass_every_regime(ref, cand, spec, opts):
    res = _v(ref, cand, spec, regimes="all", **opts)
    assert res.ok, res.summary()
    assert len(res.cases) >= 8 and all(c.checks for c in res.cases)


def test_a_pallas_kernel_against_a_numpy_reference():
    res = tpudiag.validate(f"{P}/numpy_refs.py:rmsnorm_residual", "tpudiag.kernels.rmsnorm:rmsnorm_residual",
                           "x=bf16[256,1024] residual=bf16[256,1024] weight=bf16[1024]", regimes="all", seed=3)
    assert res.ok, res.summary()
    assert res.kinds == {"reference": "numpy", "candidate": "jax"}
    # A float64 NumPy reference is its own yardstick: the candidate is held to the floor.
    ref_err = [m for c in res.cases for m in c.measures if m.what.endswith("reference vs float64")]
    assert ref_err and all(m.stats.normwise == 0 for m in ref_err)


def test_a_reference_that_calls_a_library_built_on_jax_is_a_jax_side():
    """fixtures/programs/tune_flash_attention.py:reference imports only tpudiag's kernel module (which
    imports jax): it is a JAX side, so its float64 run is a real one and the reference's own bf16
    error is measured, not taken as zero (as a NumPy reference's would be)."""
    from tpudiag.kernels.flash_attention import flash_attention

    def causal(q, k, v, interpret=False):
        return flash_attention(q, k, v, causal=True, interpret=interpret)

    res = tpudiag.validate(f"{PROGRAMS}/tune_flash_attention.py:reference", causal,
                           "q=bf16[1,2,128,128] k=bf16[1,2,128,128] v=bf16[1,2,128,128]", seed=5)
    assert res.kinds == {"reference": "jax", "candidate": "jax"}
    assert res.ok, res.summary()
    ref_err = [m for c in res.cases for m in c.measures if m.what.endswith("reference vs float64")]
    assert ref_err and all(m.stats.normwise > 1e-4 for m in ref_err)


def test_a_generator_makes_the_regimes_it_knows_and_skips_the_rest():
    res = _v("numpy_refs.py:softmax_xent", "xent_port.py:softmax_xent", f"{P}/gen.py:make_inputs", regimes="all")
    assert res.ok, res.summary()
    assert [c.regime for c in res.cases] == ["normal", "large_logits", "bounds"]
    assert "tiny" in res.skipped and res.cases[0].inputs == "logits=float32[64,1000] labels=int32[64]"


def test_the_yardstick_is_a_real_float64_run_not_the_reference_as_written():
    """refs.softmax casts to f32 itself: run with x64 as written, it would be its own float64, its
    error 0. Re-evaluated in float64 it has an error of f32's size, and a NumPy float64 softmax agrees
    with that float64 run to float64 precision."""
    from tpudiag.parity.sides import float64_call, side

    s = side(f"{P}/refs.py:softmax", "reference")
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    (out,), note = float64_call(s, [("x", x)], {})
    assert note is None and out.dtype == np.float64
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-14)
    res = _v("refs.py:softmax", "ports.py:softmax", SOFTMAX)
    ref_err = next(m for m in res.cases[0].measures if m.what == "reference vs float64")
    assert 1e-9 < ref_err.stats.normwise < 1e-5


def test_loops_and_branches_are_re_evaluated_in_float64():
    import jax
    import jax.numpy as jnp

    from tpudiag.parity.sides import Side, float64_call

    def f(x):
        x32 = x.astype(jnp.float32)
        y = jax.lax.fori_loop(0, 3, lambda i, h: h * 1.5 + 0.25, x32)  # constants exact in f32
        y, _ = jax.lax.scan(lambda c, r: (c + r, None), jnp.zeros(x.shape[-1], jnp.float32), y)
        return jax.lax.cond(y[0] > -1e9, lambda v: v.astype(jnp.bfloat16) * 3, lambda v: v.astype(jnp.bfloat16), y)

    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    (out,), note = float64_call(Side("f", f, "jax", ("x",), False), [("x", x)], {})
    want = x.astype(np.float64)
    for _ in range(3):
        want = want * 1.5 + 0.25
    if "num_consts" in str(jax.make_jaxpr(lambda v: jax.lax.scan(lambda c, r: (c, r), 0.0, v))(x[0]).eqns[0].params):
        assert note is None and out.dtype == np.float64
        np.testing.assert_allclose(out, want.sum(0) * 3, rtol=1e-13)
    else:  # jax >= 0.11's scan: run under x64 as written, and said so; the bf16 cast still rounds
        assert "ran under x64 as written" in note and "scan" in note
        np.testing.assert_allclose(out.astype(np.float64), want.sum(0) * 3, rtol=2 ** -7)


def test_a_while_loop_and_a_branch_are_re_evaluated_on_every_jax():
    import jax
    import jax.numpy as jnp

    from tpudiag.parity.sides import Side, float64_call

    def f(x, n):
        x32 = x.astype(jnp.float32)
        y = jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] / 3.0), (0, x32))[1]
        return jax.lax.cond(y.sum() > -1e9, lambda v: v * 2, lambda v: v, y)

    x = np.random.default_rng(2).standard_normal(9).astype(np.float32)
    (out,), note = float64_call(Side("f", f, "jax", ("x", "n"), False), [("x", x), ("n", np.int32(4))], {})
    assert note is None
    np.testing.assert_allclose(out, x.astype(np.float64) / 81 * 2, rtol=1e-14)  # f32 would be ~1e-7 off


def test_a_failure_is_shrunk_to_a_smaller_case_with_its_first_difference():
    res = _v("refs.py:attention", "ports.py:attention_mask_off_by_one", ATTENTION)
    (case,) = res.failures
    assert case.shrunk is not None and case.shrunk.check == "candidate vs float64"
    small = case.shrunk.inputs
    assert small != case.inputs and "q=bfloat16[1,1," in small and "first at" in case.shrunk.detail


def test_ulps_and_the_rule_against_numpys_own_arithmetic():
    rng = np.random.default_rng(4)
    want = rng.standard_normal(1000).astype(np.float32)
    steps = rng.integers(0, 6, 1000)
    got = want.copy()
    for k in range(1, 6):  # got is `steps` representable f32 numbers away from want
        got = np.where(steps >= k, np.nextafter(got, np.float32(np.inf)), got)
    st = error_stats(got, want, "float32", 0.0)
    ulps = st.ulp_max
    exact_powers = np.abs(want) == np.exp2(np.floor(np.log2(np.abs(want))))
    assert not exact_powers.any() and ulps == 5 and st.ulp_mean == pytest.approx(steps.mean())
    rule = ParityRule(k=2.0, floor=4 * 2.0 ** -23)
    ok = parity_check("c", got, want.astype(np.float64), 0.0, "float32", rule)
    assert ok.ok == (st.normwise <= rule.floor)
    nan = parity_check("c", np.array([1.0, np.nan]), np.array([1.0, 2.0]), 0.0, "float32", rule)
    assert not nan.ok and nan.worst_ratio is None and "NaN/Inf" in nan.detail


def test_json_round_trips_and_junit_has_a_testcase_per_regime(tmp_path):
    junit = tmp_path / "parity.xml"
    res = _v("refs.py:top_k", "ports.py:top_k_ties_last", "x=f32[8,100]", regimes="normal,ties", junit_path=junit,
             strict_ties=True)
    doc = json.loads(json.dumps(res.to_dict()))
    assert doc["schema"] == "tpudiag.validate/1" and ValidateResult.from_dict(doc).to_dict() == doc
    root = ET.fromstring(junit.read_text())
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == ["normal", "ties"]
    assert cases[0].find("failure") is None and "differ" in cases[1].find("failure").get("message")


def test_the_python_api_takes_callables():
    import jax
    import jax.scipy.special

    def ref(x):
        return jax.nn.gelu(x, approximate=False)

    def cand(x):
        return 0.5 * x * (1 + jax.scipy.special.erf(x * 0.7071067811865476))

    res = tpudiag.validate(ref, cand, "x=f32[64,64]", regimes="normal,outliers,tiny", seed=1)
    assert res.ok, res.summary()
    assert res.candidate.endswith("cand") and res.summary().startswith("3/3 cases passed")


def test_the_determinism_check_can_be_waived():
    res = _v("refs.py:softmax", "ports.py:softmax_nondeterministic", SOFTMAX, allow_nondeterminism=True)
    assert res.ok and not res.determinism


@pytest.mark.parametrize("args,message", [
    (("refs.py:nope", "ports.py:softmax", SOFTMAX), r"refs.py: no function 'nope' \(it defines: .*softmax"),
    (("missing.py:f", "ports.py:softmax", SOFTMAX), "missing.py: no such file"),
    (("refs.py:softmax", "ports.py:softmax", "x=f32[4,4] y=f32[4]"),
     r"the inputs \(x, y\) do not match .*refs.py:softmax's parameters: the reference takes \(x\)"),
    (("refs.py:rmsnorm", "ports.py:rmsnorm", "x=f32[8,512] w=f32[256]"),
     r"the reference .*refs.py:rmsnorm raised on x=float32\[8,512\] w=float32\[256\]"),
    (("refs.py:softmax", "ports.py:softmax", "x=f33[4]"), "unknown dtype 'f33'"),
    (("refs.py:softmax", "ports.py:softmax", "x=f32 4"), "is not NAME=DTYPE"),
    (("refs.py:top_k", "ports.py:softmax", "x=f32[8,100]"), "returns 1 output"),
    (("refs.py:softmax", "ports.py:top_k", "x=f32[8,100]"), "returns 2 output"),
])
def test_bad_arguments_are_one_line_input_errors(args, message):
    ref, cand, spec = args
    ref = ref if ref.startswith("missing") else f"{P}/{ref}"
    with pytest.raises(InputError, match=message):
        tpudiag.validate(ref if not ref.startswith("missing") else ref, f"{P}/{cand}", spec, seed=1)


def test_grad_with_a_numpy_reference_and_an_unknown_regime_are_refused():
    with pytest.raises(InputError, match="a NumPy reference has no gradient"):
        _v("numpy_refs.py:softmax_xent", "xent_port.py:softmax_xent", f"{P}/gen.py:make_inputs", grad=True)
    with pytest.raises(InputError, match="unknown regime warm"):
        _v("refs.py:softmax", "ports.py:softmax", SOFTMAX, regimes="normal,warm")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tpudiag", "validate", *args], cwd=P, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})


def test_cli_exit_codes_and_json():
    ok = _cli("refs.py:rmsnorm", "ports.py:rmsnorm", "--inputs", RMSNORM, "--json", "--seed", "2")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True, ok.stderr
    bad = _cli("refs.py:rmsnorm", "ports.py:rmsnorm_eps_outside", "--inputs", RMSNORM, "--regimes", "normal,tiny",
               "--seed", "2", "--no-color", "--width", "120")
    assert bad.returncode == 1 and "FAIL [tiny]" in bad.stdout and "smallest failing case" in bad.stdout
    assert bad.stderr.strip().splitlines()[-1].startswith("tpudiag: validate: 1 of 2 case(s) failed")
    wrong = _cli("refs.py:rmsnorm", "ports.py:rmsnorm", "--inputs", "x=bf16[8,512] w=bf16[256]")
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1


def test_a_torch_function_where_torch_is_installed():
    torch = pytest.importorskip("torch")  # tpudiag does not depend on torch; CI's legs do not install it
    res = tpudiag.validate(f"{P}/refs.py:softmax", lambda x: torch.softmax(x.float(), -1), SOFTMAX, seed=1)
    assert res.ok and res.kinds["candidate"] == "torch"


def test_a_bf16_accumulation_bug_fails_where_a_correct_blocked_sum_passes():
    """The normwise floor of a bf16 output is 4 eps (3%): a sum whose 32 block totals are
    accumulated in bf16 keeps the largest row right and loses the others. The mean ULP rule for
    16-bit outputs (k x the reference's + 1) catches it; the float32-accumulating port passes."""
    good = _v("refs.py:row_sum", "ports.py:row_sum_blocked", "x=bf16[8,4096]", regimes="all", seed=2, shrink=False)
    assert good.ok, good.summary()
    bad = _v("refs.py:row_sum", "ports.py:row_sum_bf16_running", "x=bf16[8,4096]", regimes="all", seed=2,
             shrink=False)
    assert {"normal", "large_logits"} <= {c.regime for c in bad.failures}
    assert "mean ULP error" in next(c for c in bad.failures if c.regime == "normal").why


def test_a_numpy_reference_that_casts_to_float32_is_run_in_float64():
    """Its float64 run keeps `.astype(np.float32)` in float64 (parity/sides.Float64Array), so its own
    error against float64 is measured above zero, not read as zero."""
    res = _v("numpy_refs.py:softmax_in_float32", "ports.py:softmax", "x=f32[8,512]", regimes="normal,offset")
    own = [m.stats.normwise for c in res.cases for m in c.measures if m.what == "reference vs float64"]
    assert res.ok and own and min(own) > 0
