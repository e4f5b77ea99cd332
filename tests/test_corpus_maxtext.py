"""`tpudiag suggest` on MaxText's own decoder (the `maxtext` package 0.2.5, Python >= 3.12, jax >=
0.11): a training step through MaxText's `loss_fn` over two `LlamaDecoderLayer`s, and over two
`MixtralDecoderLayer`s whose `RoutedMoE` dispatches densely (fixtures/programs/thirdparty/
maxtext_decoder.py), compiled for v5e by fixtures/artifacts/regenerate.py in an environment with
maxtext installed. The optimized HLO is the fixture, so these run without maxtext; where maxtext
is installed, each match's source line is checked against its file.

What MaxText writes, read from its source: attention with GQA as a group dimension of Q
(`btkgd,bskd->bkgts`) and a causal-within-segments mask from the batch's segment ids; RMSNorm with
`rsqrt` (two per layer and the final one); RoPE on q and k with cos/sin computed in place and the
halves rotated; a one-hot cross-entropy with a z-loss reading the same logsumexp; Mixtral's MoE with
the router's top-2 weights scattered into an 8-expert tensor that masks every expert's output. The
train step uses `remat_policy=full`: the forward runs again inside the backward."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACT_SETS
from tpudiag.analyze.suggest.detectors import BY_NAME, find_patterns
from tpudiag.cli import cli
from tpudiag.parse.hlo import read_hlo_file

LLAMA2 = ARTIFACT_SETS["jax-0.12"] / "corpus_maxtext_llama2_train"
MIXTRAL = ARTIFACT_SETS["jax-0.12"] / "corpus_maxtext_mixtral_train"
TOKENS, EXPERTS, EMB, MLP = 1024, 8, 1024, 1024


def _matches(run):
    (path,) = (run / "modules").glob("*-jit_train_step/optimized.hlo.txt")
    return find_patterns(read_hlo_file(path))


@pytest.fixture(scope="module")
def llama2():
    return _matches(LLAMA2)


@pytest.fixture(scope="module")
def mixtral():
    return _matches(MIXTRAL)


def _by(matches):
    out = {}
    for m in matches:
        out.setdefault(m.pattern, []).append(m)
    return out


def _file(m) -> str:
    return m.source[0].rsplit(":", 1)[0].split("site-packages/")[-1]


@pytest.mark.parametrize("run", ["llama2", "mixtral"])
def test_every_pattern_maxtext_writes_is_found_and_nothing_else(run, llama2, mixtral):
    by = _by(llama2 if run == "llama2" else mixtral)
    expected = {"attention", "rmsnorm", "rope", "cross_entropy"} | ({"moe"} if run == "mixtral" else set())
    assert set(by) == expected
    # one instance per layer (the forward and its recomputation read the same projections), RoPE on
    # each layer's q and k, one loss
    assert len({m.instance for m in by["attention"]}) == 2
    assert len({m.instance for m in by["rope"]}) == 4
    assert len(by["cross_entropy"]) == 1


def test_attention_has_its_kv_heads_and_the_mask_it_reads(llama2):
    for m in _by(llama2)["attention"]:
        s = m.shapes
        assert (s.batch_heads, s.q_len, s.kv_len, s.head_dim, s.kv_batch_heads) == (16, 1024, 1024, 64, 4)
        # the segment ids come from the batch: not a mask flash_attention(causal=True) computes, though
        # it is causal where every token is in one segment
        assert s.mask == "inputs"
        assert any("inputs_segmentation" in n and "causal mask where the inputs mask nothing" in n for n in m.notes)
        assert _file(m) == "maxtext/layers/attention_op.py"


def test_norms_rope_and_loss_at_maxtexts_lines(llama2):
    by = _by(llama2)
    for m in by["rmsnorm"]:
        assert (m.shapes.rows, m.shapes.hidden, m.shapes.eps) == (1024, 1024, 1e-5)
        assert _file(m) == "maxtext/layers/normalizations.py"
    for m in by["rope"]:
        assert m.shapes.layout == "half" and m.shapes.shape in ((1, 1024, 16, 64), (1, 1024, 4, 64))
        assert m.source[0].endswith("maxtext/layers/embeddings.py:265")
    (ce,) = by["cross_entropy"]
    assert (ce.shapes.rows, ce.shapes.vocab) == (1024, 32000)
    assert "labels picked by compare" in ce.notes  # MaxText's one-hot targets, not the embedding's gather
    assert _file(ce) == "maxtext/utils/max_utils.py"


def test_the_scattered_moe_dispatch_and_its_bound_by_hand(mixtral):
    from tpudiag.targets import resolve_target

    moes = _by(mixtral)["moe"]
    assert len({m.instance for m in moes}) == 2  # one per layer
    for m in moes:
        s = m.shapes
        assert (s.tokens, s.experts, s.top_k, s.matmuls) == (TOKENS, EXPERTS, 2, 3)
        # the forward's wi_0, wi_1 and wo einsums, every token through every expert: 3 x 2*T*E*M*H
        assert s.dense_flops == 3 * 2 * TOKENS * EXPERTS * EMB * MLP
        assert s.weight_bytes == 3 * EXPERTS * EMB * MLP * 2  # bf16 expert weights, each read once
        assert any("scattered" in n and "4x the FLOPs of top-2 routing" in n for n in m.notes)
        assert _file(m) == "maxtext/layers/moe.py"
        assert any(o for o in m.ops if "scatter" in o)
    chip = resolve_target("v5e").chip
    s = moes[0].shapes
    routed = s.dense_flops * 2 / 8
    by_hand = max(routed / chip.peak_bf16_flops_per_s, s.weight_bytes / chip.hbm_bytes_per_s)
    assert BY_NAME["moe"].bound(s, chip) == pytest.approx(by_hand, rel=1e-6)


def test_suggest_prices_the_moe_whole(tmp_path):
    """The whole command on the stored compile run: the MoE (forward, recomputation and gradient
    matmuls at MaxText's einsum lines) priced against top-2 routing, with the backward."""
    import importlib.metadata as md

    if tuple(int(x) for x in md.version("jax").split(".")[:2]) < (0, 11):
        pytest.skip("MaxText's run is suggested on the jax leg it was compiled with (CI time)")
    result = CliRunner().invoke(cli, ["suggest", "--all", "--json", "--no-static-profile", str(MIXTRAL)])
    assert result.exit_code == 0, result.output
    by = {s["pattern"]: s for s in json.loads(result.stdout)["suggestions"]}  # stderr: progress
    moe = by["moe"]
    assert moe["backward"] and moe["shown"] and moe["expected_speedup"] > 3 and moe["share"] > 0.1
    assert "2 instances at this source line (one per layer or tensor), each priced" in moe["notes"]
    att = by["attention"]
    assert att["kernel"] is None and att["snippet"] is None  # a mask from the inputs: nothing priced wrong
    assert "2 instances at this source line (one per layer or tensor), each priced" in att["notes"]


@pytest.mark.skipif(importlib.util.find_spec("maxtext") is None, reason="maxtext is not installed here")
def test_source_lines_are_maxtexts_own(llama2, mixtral):
    """Where maxtext is installed (as when the fixture is regenerated), each first source line holds
    the code of its pattern."""
    from pathlib import Path

    root = Path(importlib.util.find_spec("maxtext").origin).parent.parent
    words = {"attention": ("logits", "exp"), "rmsnorm": ("rsqrt", "mean"), "rope": ("cos",),
             "cross_entropy": ("log",), "moe": ("einsum",)}
    for m in [*llama2, *mixtral]:
        file, line = m.source[0].rsplit(":", 1)
        text = (root / file.split("site-packages/")[-1]).read_text().splitlines()
        window = " ".join(text[int(line) - 2:int(line) + 1])
        assert any(w in window for w in words[m.pattern]), (m.pattern, m.source[0], window)


def test_the_programs_versions_are_recorded():
    for run in (LLAMA2, MIXTRAL):
        versions = json.loads((run / "VERSIONS.json").read_text())
        assert versions["maxtext"] == "0.2.5"
        assert tuple(int(x) for x in versions["jax"].split(".")[:2]) >= (0, 11)
