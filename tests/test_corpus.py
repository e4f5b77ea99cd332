"""`tpudiag suggest` on model code written by others: transformers' own `FlaxLlamaForCausalLM` and
`FlaxGPTJForCausalLM` (transformers 4.57.6, installed from PyPI by the test extra), each a training
step with optax's cross-entropy, and its Flax logits warpers (a top-p sampler), compiled for v5e by
fixtures/artifacts/regenerate.py (the scripts in `fixtures/programs/thirdparty/`). Every pattern their source contains is found, with its mask,
head counts, epsilon and rotary layout, each at the line of the installed model file that writes
it; nothing else is found."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACTS
from tpudiag.analyze.suggest.detectors import find_patterns
from tpudiag.cli import cli
from tpudiag.parse.hlo import read_hlo_file

LLAMA = ARTIFACTS / "corpus_flax_llama_train"
GPTJ = ARTIFACTS / "corpus_flax_gptj_train"


def _module(run=LLAMA, name="jit_train_step"):
    (path,) = (run / "modules").glob(f"*-{name}/optimized.hlo.txt")
    return read_hlo_file(path)


def _installed(source: str) -> tuple[Path, int]:
    """A `file:line` of the regenerating machine's site-packages, as a file of this environment."""
    file, line = source.rsplit(":", 1)
    rel = file.split("site-packages/", 1)[1]
    spec = importlib.util.find_spec(rel.split("/", 1)[0])
    return Path(spec.origin).parent.parent / rel, int(line)


def _function_of(source: str) -> tuple[str, str]:
    """(the qualified name of the function holding the line, the line's text), from the installed file."""
    path, line = _installed(source)
    text = path.read_text()
    name = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)) and child.lineno <= line <= child.end_lineno:
                name.append(prefix + child.name)
                visit(child, prefix + child.name + ".")

    visit(ast.parse(text), "")
    return (name[-1] if name else ""), text.splitlines()[line - 1]


@pytest.fixture(scope="module")
def matches():
    return find_patterns(_module())


@pytest.fixture(scope="module")
def gptj():
    return find_patterns(_module(GPTJ))


def test_every_pattern_the_model_writes_is_found_and_nothing_else(matches):
    by = {}
    for m in matches:
        by.setdefault(m.pattern, []).append(m)
    # 2 layers: an attention each (forward; the backward's recomputation shares its ops), two
    # RMSNorms each and the final one (forward and gradient), RoPE on q and k, one cross-entropy.
    assert {p: len(ms) for p, ms in by.items()} == {"attention": 2, "rmsnorm": 10, "rope": 4, "cross_entropy": 1}


def test_attention_is_causal_grouped_and_at_the_model_line(matches):
    for m in (m for m in matches if m.pattern == "attention"):
        s = m.shapes
        assert (s.batch_heads, s.q_len, s.kv_len, s.head_dim, s.kv_batch_heads) == (16, 1024, 1024, 64, 4)
        assert (s.mask, s.mask_offset) == ("causal", 0)  # an additive bias built by lax.select
        func, text = _function_of(m.source[0])
        assert func == "FlaxLlamaAttention.__call__" and "dot_product_attention_weights" in text, (m.source[0], text)
        assert any("flax/linen/attention.py" in s for s in m.source[1:])  # the library line kept after it


def test_rmsnorm_is_found_with_its_epsilon_at_the_model_line(matches):
    norms = [m for m in matches if m.pattern == "rmsnorm"]
    assert {m.anchors[0].split(".")[0] for m in norms} == {"sqrt", "rsqrt"}  # x / sqrt(var + eps), its gradient
    for m in norms:
        assert (m.shapes.rows, m.shapes.hidden, m.shapes.eps) == (1024, 1024, 1e-5)
        assert _function_of(m.source[0])[0] == "FlaxLlamaRMSNorm.__call__", m.source[0]


def test_rope_reads_the_gathered_table_and_the_half_rotation(matches):
    ropes = [m for m in matches if m.pattern == "rope"]
    assert sorted(m.shapes.shape for m in ropes) == [(1024, 4, 64)] * 2 + [(1024, 16, 64)] * 2  # k and q
    for m in ropes:
        assert m.shapes.layout == "half" and "cos and sin read from a table" in m.notes
        func, _ = _function_of(m.source[0])
        assert func == "apply_rotary_pos_emb"


def test_optax_cross_entropy_is_found_at_the_loss_line(matches):
    (ce,) = [m for m in matches if m.pattern == "cross_entropy"]
    assert (ce.shapes.rows, ce.shapes.vocab) == (1024, 32000)
    assert ce.source[0].split(":")[0].endswith("fixtures/programs/thirdparty/flax_llama.py")  # the loss_fn line


def test_suggest_prices_attention_whole_and_keeps_its_mask():
    """The whole command, on the stored compile run: attention's forward and gradient ops priced
    against the kernel's forward and backward, once per layer; the snippet is causal (copying it
    keeps the model's mask). The norms and RoPE are fused into the matmuls around them on TPU: XLA's
    separate ops for them take under half what their data needs, so they are listed as handled by
    XLA, not priced as a sliver."""
    import importlib.metadata as md

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) > (0, 10):
        pytest.skip("the kernels compile for the suggestion on the oldest jax leg only (CI time)")
    result = CliRunner().invoke(cli, ["suggest", "--all", "--json", "--no-static-profile", str(LLAMA)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stderr has the progress lines
    by = {s["pattern"]: s for s in doc["suggestions"]}
    att = by["attention"]
    assert "causal=True" in att["snippet"] and att["shapes"]["kv_batch_heads"] == 4
    assert att["backward"] and att["shown"] and att["share"] > 0.15  # the gradient's fusions count
    assert "2 instances at this source line (one per layer or tensor), each priced" in att["notes"]
    assert att["source"][0].split(":")[0].endswith("transformers/models/llama/modeling_flax_llama.py")
    fused = {r["pattern"] for r in doc["replaced"] if r["by"] == "fusion into its matmuls"}
    assert fused == {"rmsnorm", "rope"} and "rmsnorm" not in by and "rope" not in by


def test_gptj_every_pattern_is_found_and_nothing_else(gptj):
    """GPT-J: multi-head attention (no grouping), flax's LayerNorm (ln_1 in each block and ln_f,
    forward and gradient), interleaved RoPE on the first 32 dims of q and k, optax's cross-entropy."""
    counts = {}
    for m in gptj:
        counts[m.pattern] = counts.get(m.pattern, 0) + 1
    assert counts == {"attention": 2, "layernorm": 6, "rope": 4, "cross_entropy": 1}
    for m in gptj:
        func, text = _function_of(m.source[0]) if "site-packages" in m.source[0] else ("", "")
        if m.pattern == "attention":
            s = m.shapes
            assert (s.batch_heads, s.kv_batch_heads, s.q_len, s.head_dim, s.mask) == (16, 16, 1024, 64, "causal")
            assert func == "FlaxGPTJAttention.__call__" and "dot_product_attention_weights" in text
        elif m.pattern == "layernorm":
            assert (m.shapes.rows, m.shapes.hidden, m.shapes.eps) == (1024, 1024, 1e-5)
            assert func in ("FlaxGPTJBlock.__call__", "FlaxGPTJModule.__call__") and "self.ln_" in text
        elif m.pattern == "rope":
            assert m.shapes.layout == "interleaved" and m.shapes.shape == (1, 1024, 16, 32)
            assert func == "apply_rotary_pos_emb"
        else:
            assert (m.shapes.rows, m.shapes.vocab) == (1024, 50400)
            assert m.source[0].split(":")[0].endswith("fixtures/programs/thirdparty/flax_gptj.py")


_LLAMA_ATTENTION_REF = '''
import jax.numpy as jnp
from flax.linen.attention import dot_product_attention_weights
from jax import lax
from transformers.models.llama.modeling_flax_llama import make_causal_mask


def llama_attention(q, k, v):
    """FlaxLlamaAttention.__call__'s own steps: GQA by jnp.repeat, the causal mask as an additive bias
    built by lax.select, flax's attention weights in f32, the PV einsum. q, k, v [B, S, H, D]."""
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    mask = make_causal_mask(jnp.ones((1, q.shape[1]), dtype="bool"), dtype="bool")
    bias = lax.select(mask > 0, jnp.full(mask.shape, 0.0).astype(q.dtype),
                      jnp.full(mask.shape, jnp.finfo(q.dtype).min).astype(q.dtype))
    w = dot_product_attention_weights(q, k, bias=bias, dtype=jnp.float32)
    return jnp.einsum("...hqk,...khd->...qhd", w.astype(q.dtype), v)
'''


def _snippet_module(snippet: str) -> str:
    """The suggestion's snippet as a function of the model's [B, S, H, D] q, k, v (the snippet's
    layout is [B, H, S, D]), its kernel call run in interpret mode."""
    tree = ast.parse(snippet)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "flash_attention")
    call.keywords.append(ast.keyword(arg="interpret", value=ast.Constant(True)))
    body = "\n".join("    " + line for line in ast.unparse(tree).splitlines())
    return ("import jax.numpy as jnp\n\n\ndef snippet(q, k, v):\n"
            "    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))\n"
            f"{body}\n    return jnp.swapaxes(out, 1, 2)\n")


@pytest.mark.parametrize("drop_mask", [False, True])
def test_the_attention_snippet_computes_what_the_model_computes(matches, tmp_path, drop_mask):
    """`tpudiag validate` of the suggested snippet (the bundled kernel in interpret mode) against the
    model's own attention code at the corpus program's shapes: it passes; the same snippet with the
    mask dropped (what the snippet said before masks were read) fails."""
    import importlib.metadata as md

    from tpudiag.analyze.suggest.detectors.attention import PREFILL
    from tpudiag.kernels.at_shapes import setup_for

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) > (0, 10):
        pytest.skip("the kernel runs in interpret mode at the corpus shapes on the oldest jax leg only (CI time)")
    att = next(m for m in matches if m.pattern == "attention")
    snippet = setup_for(PREFILL, att.shapes, att.notes).snippet
    assert "causal=True" in snippet
    if drop_mask:
        snippet = snippet.replace("causal=True", "causal=False")
    (tmp_path / "ref.py").write_text(_LLAMA_ATTENTION_REF)
    (tmp_path / "cand.py").write_text(_snippet_module(snippet))
    s = att.shapes
    q, kv = f"bf16[1,{s.q_len},{s.batch_heads},{s.head_dim}]", f"bf16[1,{s.kv_len},{s.kv_batch_heads},{s.head_dim}]"
    result = CliRunner().invoke(cli, ["validate", "--json", "--seed", "1", "--no-shrink", f"{tmp_path}/ref.py:llama_attention",
                                      f"{tmp_path}/cand.py:snippet", "--inputs", f"q={q} k={kv} v={kv}"])
    doc = json.loads(result.output)
    assert result.exit_code == (1 if drop_mask else 0), result.output
    assert doc["ok"] is (not drop_mask) and doc["failed"] == (1 if drop_mask else 0)


def test_transformers_flax_sampler_is_found_at_its_own_parameters():
    """transformers' FlaxTemperatureLogitsWarper(0.8) and FlaxTopPLogitsWarper(0.9): one sampler, its
    top-p read off the cumulative sum's comparison, its temperature off the scaled logits, no top-k
    (the warper's `lax.top_k` over the whole vocabulary is a sort, not a cut)."""
    (m,) = find_patterns(_module(ARTIFACTS / "corpus_flax_sampler", "jit_sample"))
    s = m.shapes
    assert (m.pattern, s.rows, s.vocab, s.top_k, s.top_p, s.temperature) == ("sampling", 8, 32000, None, 0.9, 0.8)
    assert _function_of(m.source[0])[0] == "FlaxTopPLogitsWarper.__call__"
    from tpudiag.analyze.suggest.detectors import BY_NAME
    from tpudiag.kernels.at_shapes import setup_for

    assert "sample(logits, u, k=None, p=0.9, temperature=0.8)" in setup_for(BY_NAME["sampling"], s).snippet


_OPTAX_CE_REF = '''
import jax.numpy as jnp
import optax


def optax_loss(logits, labels):
    """flax_llama.py's loss_fn after the LM head: optax's integer-label cross-entropy in f32, the mean."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()
'''


def _snippet_function(snippet: str, kernel: str, args: str, result: str) -> str:
    """The suggestion's snippet as a function of `args` returning `result`, its kernel call run in
    interpret mode: the snippet's own lines, unchanged otherwise."""
    tree = ast.parse(snippet)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == kernel)
    call.keywords.append(ast.keyword(arg="interpret", value=ast.Constant(True)))
    body = "\n".join("    " + line for line in ast.unparse(tree).splitlines())
    return f"def snippet({args}):\n{body}\n    return {result}\n"


def test_the_cross_entropy_snippet_computes_what_optax_computes(tmp_path):
    """`tpudiag validate` of the cross-entropy snippet (the bundled kernel in interpret mode) against
    optax's loss as flax_llama.py calls it, at the corpus program's rows and vocabulary."""
    import importlib.metadata as md

    from tpudiag.analyze.suggest.detectors import BY_NAME
    from tpudiag.kernels.at_shapes import setup_for

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) > (0, 10):
        pytest.skip("the kernel runs in interpret mode at the corpus shapes on the oldest jax leg only (CI time)")
    (ce,) = [m for m in find_patterns(_module()) if m.pattern == "cross_entropy"]
    snippet = setup_for(BY_NAME["cross_entropy"], ce.shapes, ce.notes).snippet
    (tmp_path / "ref.py").write_text(_OPTAX_CE_REF)
    (tmp_path / "cand.py").write_text(_snippet_function(snippet, "cross_entropy", "logits, labels", "loss"))
    n, v = ce.shapes.rows, ce.shapes.vocab
    result = CliRunner().invoke(cli, ["validate", "--json", "--seed", "1", "--no-shrink", f"{tmp_path}/ref.py:optax_loss",
                                      f"{tmp_path}/cand.py:snippet", "--inputs",
                                      f"logits=bf16[{n},{v}] labels=s32[{n}]{{0..{v - 1}}}"])
    doc = json.loads(result.output)
    assert result.exit_code == 0 and doc["ok"] is True, result.output


_WARPERS_REF = '''
import jax
import jax.numpy as jnp
from transformers.generation.flax_logits_process import FlaxTemperatureLogitsWarper, FlaxTopPLogitsWarper


def warped_draw(logits, u):
    """flax_sampler.py's distribution, transformers' own warpers: temperature 0.8, then top-p 0.9.
    The draw is the inverse CDF of that distribution in vocabulary order at the uniform u (the
    snippet's documented draw), so the two sides can be compared token for token."""
    scores = FlaxTemperatureLogitsWarper(0.8)(None, logits, 0)
    scores = FlaxTopPLogitsWarper(0.9)(None, scores, 0)
    cdf = jnp.cumsum(jax.nn.softmax(scores, axis=-1), axis=-1)
    return jnp.sum(cdf <= u[:, None] * cdf[:, -1:], axis=-1).astype(jnp.int32)
'''

_DRAW_INPUTS = '''
import numpy as np


def make(seed, regime):
    rng = np.random.default_rng(seed)
    return {"logits": (3 * rng.standard_normal((ROWS, VOCAB))).astype(np.float32),
            "u": rng.uniform(0.0, 1.0, ROWS).astype(np.float32)}
'''


def test_the_sampling_snippet_draws_what_the_warpers_define(tmp_path):
    """`tpudiag validate` of the sampling snippet (the bundled kernel in interpret mode) against
    transformers' FlaxTemperatureLogitsWarper(0.8) and FlaxTopPLogitsWarper(0.9) at the corpus
    program's rows and vocabulary, drawn by the same uniform: the same token in every row."""
    import importlib.metadata as md

    from tpudiag.analyze.suggest.detectors import BY_NAME
    from tpudiag.kernels.at_shapes import setup_for

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) > (0, 10):
        pytest.skip("the kernel runs in interpret mode at the corpus shapes on the oldest jax leg only (CI time)")
    (m,) = find_patterns(_module(ARTIFACTS / "corpus_flax_sampler", "jit_sample"))
    snippet = setup_for(BY_NAME["sampling"], m.shapes).snippet
    (tmp_path / "ref.py").write_text(_WARPERS_REF)
    (tmp_path / "cand.py").write_text(_snippet_function(snippet, "sample", "logits, u", "tokens"))
    (tmp_path / "gen.py").write_text(_DRAW_INPUTS.replace("ROWS", str(m.shapes.rows))
                                     .replace("VOCAB", str(m.shapes.vocab)))
    result = CliRunner().invoke(cli, ["validate", "--json", "--seed", "1", "--no-shrink", f"{tmp_path}/ref.py:warped_draw",
                                      f"{tmp_path}/cand.py:snippet", "--inputs", f"{tmp_path}/gen.py:make"])
    doc = json.loads(result.output)
    assert result.exit_code == 0 and doc["ok"] is True, result.output


DECODE = ARTIFACTS / "corpus_flax_llama_decode"


def test_a_cached_generation_step_maps_to_ragged_paged_attention_with_its_write():
    """transformers' own cached decode (`init_cache`, then one token for each of 8 sequences): each
    layer writes its new key and value into the cache with dynamic_update_slice, then reads the whole
    cache, its 4 KV heads repeated for 16 query heads. The detector reads the batch from the cache
    written, the grouping through XLA's multiply-and-sum form of a one-query matmul, and the writes
    as the pattern's ops; the kernel that writes and reads pages prices it, the contiguous cache
    taken as pages in order."""
    import re

    from tpudiag.kernels.at_shapes import setup_for

    att = [m for m in find_patterns(_module(DECODE, "jit_decode_step")) if m.pattern == "attention_decode"]
    assert len(att) == 2  # one a layer
    # oracle: the entry's dynamic-update-slices that transformers' cache update writes
    (path,) = (DECODE / "modules").glob("*-jit_decode_step/optimized.hlo.txt")
    writes = set(re.findall(r"\n\s*%(\S+) = [^\n]* dynamic-update-slice\([^\n]*_concatenate_to_cache", path.read_text()))
    assert len(writes) == 4 and writes == {op for m in att for op in m.ops if op in writes}
    for m in att:
        s = m.shapes
        assert (s.batch, s.batch_heads, s.kv_batch_heads, s.kv_len, s.head_dim) == (8, 128, 32, 1024, 64)
        assert s.page_size == 0 and s.kv_written
        assert _function_of(m.source[0])[0] == "FlaxLlamaAttention.__call__", m.source[0]
        setup = setup_for(m.detector, s)
        assert setup.kernel == "ragged_paged_attention" and setup.donate == (3, 4)
        assert [a.shape for a in setup.args] == [(8, 16, 64), (8, 4, 64), (8, 4, 64), (4, 64, 128, 64),
                                                 (4, 64, 128, 64), (8,), (8, 8), (9,), (1,)]
        assert "arange(64).reshape(8, 8)" in setup.snippet and "write_kv_pages" in setup.snippet


def test_suggest_prices_the_cached_decode_with_ragged_paged_attention():
    """The whole command on the stored decode run: attention_decode gets ragged_paged_attention,
    compiled for v5e at the model's shapes, with a gain over XLA's step."""
    import importlib.metadata as md

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) > (0, 10):
        pytest.skip("the kernels compile for the suggestion on the oldest jax leg only (CI time)")
    result = CliRunner().invoke(cli, ["suggest", "--all", "--json", "--no-static-profile", str(DECODE)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (att,) = [s for s in doc["suggestions"] if s["pattern"] == "attention_decode"]
    assert att["kernel"] == "ragged_paged_attention" and att["shapes"]["kv_written"]
    assert "2 instances at this source line (one per layer or tensor), each priced" in att["notes"]
    assert att["kernel_s"] is not None and att["xla_s"] > att["kernel_s"]
