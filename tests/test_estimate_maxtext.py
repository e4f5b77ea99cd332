"""`tpudiag estimate maxtext:MODEL`: MaxText's own train step. Without the `maxtext` package the
refusal is one line (exit 2, nothing written); with it (Python >= 3.12, the `maxtext` extra), a
two-layer Llama 3.1 built by MaxText's own pyconfig is estimated with MaxText's FLOP count."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tpudiag.capture.maxtext_step import maxtext_topology, split_overrides
from tpudiag.errors import InputError
from tpudiag.targets import resolve_target

HAVE_MAXTEXT = importlib.util.find_spec("maxtext") is not None


def _run(*args, timeout=900) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "tpudiag", "estimate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("target,name", [("v6e-256", "v6e-256"), ("v5p-1024", "v5p-1024"), ("v4-128", "v4-128"),
                                         ("tpu7x-128", "tpu7x-128"), ("v5e:2x4", "v5e-8")])
def test_maxtext_names_slices_by_tensorcores(target, name):
    t = resolve_target(target)
    assert maxtext_topology(t.chip.name, t.chips, t.chip.tensorcores_per_chip) == name


def test_overrides_are_key_value():
    assert split_overrides(["per_device_batch_size=4", "sa_block_q=2048"]) == ["per_device_batch_size=4", "sa_block_q=2048"]
    with pytest.raises(InputError, match="'--layers' is not a MaxText override"):
        split_overrides(["--layers", "2"])


def test_refusals_are_one_line(tmp_path):
    out = tmp_path / "r"
    res = _run("maxtext:llama3.1-8b", "--target", "v6e-8", "--mesh", "fsdp=8", "--out", str(out), timeout=120)
    assert res.returncode == 2 and "builds MaxText's own mesh" in res.stderr and "Traceback" not in res.stderr
    res = _run("maxtext:../x", "--target", "v6e-8", "--out", str(out), timeout=120)
    assert res.returncode == 2 and "expected maxtext:MODEL" in res.stderr
    res = _run("maxtext:llama3.1-8b", "--target", "v6e-8", "--out", str(out), "--", "--layers", "2", timeout=120)
    assert res.returncode == 2 and "not a MaxText override" in res.stderr
    assert not out.exists()


@pytest.mark.skipif(HAVE_MAXTEXT, reason="maxtext is installed here")
def test_without_maxtext_the_refusal_says_how_to_install(tmp_path):
    out = tmp_path / "r"
    res = _run("maxtext:llama3.1-8b", "--target", "v6e-8", "--out", str(out), timeout=300)
    lines = [x for x in res.stderr.splitlines() if x.startswith("tpudiag: error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "maxtext package is not importable" in lines[0] and "tpudiag[maxtext]" in lines[0]
    assert not out.exists()


@pytest.mark.skipif(not HAVE_MAXTEXT, reason="needs the maxtext package (Python >= 3.12: pip install '.[maxtext]')")
def test_maxtext_step_is_estimated_with_maxtexts_flop_count(tmp_path):
    res = _run("maxtext:llama3.1-8b", "--target", "v6e-8", "--out", str(tmp_path / "mt"), "--json", "--",
               "override_model_config=True", "base_num_decoder_layers=2", "base_emb_dim=512", "base_mlp_dim=1024",
               "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=128", "vocab_size=4096",
               "per_device_batch_size=1", "max_target_length=512")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["fits"] and doc["program"] == "maxtext:llama3.1-8b"
    assert doc["tokens"] == 8 * 512 and doc["mesh"] == {"fsdp": 8}
    # MaxText's own count (calculate_tflops_training_per_device), per device x 8
    assert doc["model_flops_detail"]["weights"] > 0 and doc["model_flops_detail"]["attention"] > 0
    assert doc["model_flops"] == pytest.approx(sum(doc["model_flops_detail"].values()))
    res = _run("maxtext:llama3.1-8bb", "--target", "v6e-8", "--out", str(tmp_path / "bad"))
    assert res.returncode == 2 and "did you mean llama3.1-8b" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(not HAVE_MAXTEXT, reason="needs the maxtext package (Python >= 3.12: pip install '.[maxtext]')")
def test_a_moe_step_with_tokamax_kernels_lowers_for_tpu_on_cpu(tmp_path):
    """tokamax's grouped matmul checks the default device (the CPU here), and its gradient calls a
    kernel that checks again: the step lowers with tokamax's own cross-compile switch, and the
    compiled program runs tokamax's Mosaic kernel, not XLA's ragged dot."""
    res = _run("maxtext:qwen3-235b-a22b", "--target", "tpu7x-8", "--out", str(tmp_path / "moe"), "--json", "--",
               "override_model_config=True", "base_num_decoder_layers=1", "base_emb_dim=512", "base_moe_mlp_dim=256",
               "num_experts=8", "num_experts_per_tok=2", "base_num_query_heads=4", "base_num_kv_heads=2",
               "head_dim=128", "vocab_size=4096", "per_device_batch_size=1", "max_target_length=512",
               "megablox=False", "sparse_matmul=True", "use_tokamax_gmm=True", "remat_policy=full")
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok" and doc["fits"]
    (hlo,) = (tmp_path / "moe" / "modules").glob("*/optimized.hlo.txt")
    kernels = [line for line in hlo.read_text().splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    assert any("pallas_tpu_ragged_dot_gmm" in line for line in kernels), len(kernels)
    # tokamax's kernels are megablox-style: timed over the row tiles they visit, gmm's bytes from its tiles
    (note,) = [f for f in doc["findings"] if "grouped matmul(s) on a grid sized by the routing" in f]
    assert "with the kernel's tiles in its metadata take the bytes its pipeline moves" in note
