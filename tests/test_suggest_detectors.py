"""The suggest detectors as a registry (analyze/suggest/detectors/): one list of patterns, each with
its label, its typed shapes in document order, its bound and its kernel; and the gated-MLP detector
on third-party-shaped code (the Llama MLP as transformers' Flax port writes it), compiled for CPU."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from tests.conftest import ARTIFACT_SETS
from tpudiag.analyze.suggest.detectors import BY_NAME, DETECTORS, find_patterns
from tpudiag.analyze.suggest.detectors.gated_mlp import GATED_MLP, GatedMlpShapes
from tpudiag.kernels.at_shapes import BUILDERS, setup_for
from tpudiag.kernels.registry import all_specs
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
from tpudiag.results.suggest import PATTERN_LABELS
from tpudiag.targets import resolve_target


def test_the_registry_is_the_one_list_of_patterns():
    names = [d.name for d in DETECTORS]
    assert len(names) == len(set(names)) and set(names) == set(PATTERN_LABELS)
    assert all(d.label == PATTERN_LABELS[d.name] for d in DETECTORS)
    kernels = {s.name for s in all_specs()}
    for d in DETECTORS:  # a kernel the bundle has and at_shapes builds, or a reason there is none
        assert (d.kernel in BUILDERS and d.kernel in kernels) if d.kernel else d.no_kernel, d
        if not d.kernel:
            assert setup_for(d, None) == d.no_kernel


def test_shapes_serialize_in_the_order_the_detectors_always_wrote_them():
    """A fresh report renders `shapes` in this order; `--json` sorts the keys."""
    (path,) = [p for p in find_optimized_modules(ARTIFACT_SETS["jax-0.10"] / "decoder" / "hlo").values()
               if "train_step" in p.name]
    first = {}
    for m in find_patterns(read_hlo_file(path)):
        first.setdefault(m.pattern, m.shapes.to_dict())
    assert {k: list(v) for k, v in first.items()} == {
        "attention": ["batch_heads", "q_len", "kv_len", "head_dim", "kv_batch_heads", "dtype", "softmax_dtype"],
        "rmsnorm": ["rows", "hidden", "dtype"],
        "gated_mlp": ["tokens", "hidden", "intermediate", "dtype"],
    }


def test_a_plain_mlps_gradient_is_no_gated_mlp():
    """dp_train.py: tanh(x @ w1 + b1) @ w2. Its backward multiplies a matmul (d_h) by a function of
    another (1 - tanh^2), which is not silu(g) or gelu(g): the detector wants g times its nonlinearity."""
    for version in ARTIFACT_SETS:
        for path in find_optimized_modules(ARTIFACT_SETS[version] / "compile_v5p_dp_train" / "modules"
                                           / "00-jit_train_step" / "hlo").values():
            assert not [m for m in find_patterns(read_hlo_file(path)) if m.pattern == "gated_mlp"]


def test_the_gated_mlp_bound_is_its_matmuls_against_its_weights():
    chip = resolve_target("v5e").chip
    s = GatedMlpShapes(tokens=4096, hidden=4096, intermediate=14336, dtype="bf16")
    flops, nbytes = 3 * 2 * 4096 * 4096 * 14336, 2 * (3 * 4096 * 14336 + 2 * 4096 * 4096)
    want = max(nbytes / chip.hbm_bytes_per_s, flops / chip.peak_bf16_flops_per_s)
    assert GATED_MLP.bound(s, chip) == pytest.approx(want, rel=1e-12)
    assert GATED_MLP.bound(s, chip, backward=True) == pytest.approx(3 * want, rel=1e-12)
    decode = dataclasses.replace(s, tokens=8)  # a decode step reads the weights: memory-bound
    assert GATED_MLP.bound(decode, chip) == pytest.approx(2 * (3 * 4096 * 14336 + 2 * 8 * 4096)
                                                          / chip.hbm_bytes_per_s, rel=1e-12)


# -- third-party-shaped code ---------------------------------------------------------------------
# The MLP of transformers 4.57's Flax Llama (src/transformers/models/llama/modeling_flax_llama.py,
# FlaxLlamaMLP, Apache-2.0, (c) the HuggingFace team), kept as it computes: flax's nn.Dense is
# `lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))` without a bias, and
# ACT2FN maps "silu" to nn.silu, "gelu_new" to nn.gelu(approximate=True), "gelu" to
# nn.gelu(approximate=False). Written without flax (not a dependency here).

ACT2FN = {"silu": lambda x: __import__("jax").nn.silu(x),
          "gelu_new": lambda x: __import__("jax").nn.gelu(x, approximate=True),
          "gelu": lambda x: __import__("jax").nn.gelu(x, approximate=False)}


def _dense(inputs, kernel):
    import jax

    return jax.lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))


def flax_llama_mlp(params, hidden_states, hidden_act="silu"):
    """FlaxLlamaMLP.__call__."""
    act = ACT2FN[hidden_act]
    up_proj_states = _dense(hidden_states, params["up_proj"])
    gate_states = act(_dense(hidden_states, params["gate_proj"]))

    hidden_states = _dense(up_proj_states * gate_states, params["down_proj"])
    return hidden_states


def flax_gptj_mlp(params, hidden_states):
    """FlaxGPTJMLP.__call__ (fc_in, act, fc_out; dropout off): an MLP with no gate."""
    hidden_states = _dense(hidden_states, params["fc_in"]) + params["fc_in_bias"]
    hidden_states = ACT2FN["gelu_new"](hidden_states)
    return _dense(hidden_states, params["fc_out"]) + params["fc_out_bias"]


B, S, HIDDEN, INTER = 2, 128, 256, 688  # Llama's intermediate is not a multiple of 128 either (11008 = 86 x 128)


def _cpu_matches(tmp_path, fn, args):
    import jax

    text = jax.jit(fn).lower(*args).compile().as_text()
    path = tmp_path / "module.after_optimizations.txt"
    path.write_text(text)
    return find_patterns(read_hlo_file(path))


def _llama_args(dtype):
    import jax

    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"gate_proj": jax.random.normal(ks[0], (HIDDEN, INTER), dtype) * 0.02,
              "up_proj": jax.random.normal(ks[1], (HIDDEN, INTER), dtype) * 0.02,
              "down_proj": jax.random.normal(ks[2], (INTER, HIDDEN), dtype) * 0.02}
    return params, jax.random.normal(ks[3], (B, S, HIDDEN), dtype)


@pytest.mark.parametrize("hidden_act,spelled", [("silu", "SwiGLU"), ("gelu_new", "GeGLU"), ("gelu", "GeGLU")])
def test_the_flax_llama_mlp_forward_is_a_gated_mlp(tmp_path, hidden_act, spelled):
    import jax.numpy as jnp

    params, x = _llama_args(jnp.bfloat16)
    (m,) = [m for m in _cpu_matches(tmp_path, functools.partial(flax_llama_mlp, hidden_act=hidden_act), (params, x))
            if m.pattern == "gated_mlp"]
    assert m.shapes == GatedMlpShapes(tokens=B * S, hidden=HIDDEN, intermediate=INTER, dtype="bf16")
    assert m.notes[0].startswith(spelled) and m.detector is BY_NAME["gated_mlp"] and m.ops


def test_the_flax_llama_mlp_training_step_has_its_forward_and_gradient(tmp_path):
    import jax
    import jax.numpy as jnp

    params, x = _llama_args(jnp.float32)

    def step(params, x):
        return jax.grad(lambda p: jnp.mean(flax_llama_mlp(p, x) ** 2))(params)

    mlp = [m for m in _cpu_matches(tmp_path, step, (params, x)) if m.pattern == "gated_mlp"]
    assert mlp and {m.shapes for m in mlp} == {GatedMlpShapes(tokens=B * S, hidden=HIDDEN, intermediate=INTER,
                                                              dtype="f32")}


def test_an_mlp_without_a_gate_is_not_one(tmp_path):
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"fc_in": jax.random.normal(ks[0], (HIDDEN, INTER)) * 0.02, "fc_in_bias": jnp.zeros((INTER,)),
              "fc_out": jax.random.normal(ks[1], (INTER, HIDDEN)) * 0.02, "fc_out_bias": jnp.zeros((HIDDEN,))}
    x = jax.random.normal(ks[2], (B, S, HIDDEN))

    def step(params, x):
        return jax.grad(lambda p: jnp.mean(flax_gptj_mlp(p, x) ** 2))(params)

    for fn in (flax_gptj_mlp, step):
        assert not [m for m in _cpu_matches(tmp_path, fn, (params, x)) if m.pattern == "gated_mlp"]


def test_expert_mlps_stay_the_moe_detectors(tmp_path):
    """Experts as moe_layer.py writes them: weights stacked [experts, d, f] (3-D), the dense dispatch the
    MoE detector prices; not a gated MLP."""
    import jax
    import jax.numpy as jnp

    e, t, d, f = 4, 64, 128, 256
    ks = jax.random.split(jax.random.PRNGKey(2), 4)
    w_gate, w_up = (jax.random.normal(k, (e, d, f)) * 0.02 for k in ks[:2])
    w_down = jax.random.normal(ks[2], (e, f, d)) * 0.02
    xe = jax.random.normal(ks[3], (e, t, d))

    def experts(xe, w_gate, w_up, w_down):
        h = jax.nn.silu(jnp.einsum("etd,edf->etf", xe, w_gate)) * jnp.einsum("etd,edf->etf", xe, w_up)
        return jnp.einsum("etf,efd->etd", h, w_down)

    assert not [m for m in _cpu_matches(tmp_path, experts, (xe, w_gate, w_up, w_down)) if m.pattern == "gated_mlp"]
