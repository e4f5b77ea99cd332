"""The attention mask of a real TPU v5e training step, read from the TPU compiler's optimized HLO
(fixtures/tpu-v5e/llama_train_xla_attention: `llama_train.py --attention xla`, a causal mask built
by `jnp.tril`, 12 layers in a scan, profiled on the chip)."""

from __future__ import annotations

from pathlib import Path

from tpudiag.analyze.suggest.detectors import find_patterns
from tpudiag.parse.hlo import read_hlo_file

RUN = Path(__file__).resolve().parents[2] / "fixtures" / "tpu-v5e" / "llama_train_xla_attention"


def test_the_causal_mask_of_a_scanned_step_compiled_for_tpu_reads_causal():
    """The compiler carries the mask into the scanned loops as a loop-carried pred[2048,2048] that each
    iteration rebuilds from async slices of another element (ConcatBitcast), selects with it over
    [4,8,2,2048,2048] broadcasts, and computes the backward's probabilities in a [.., keys, queries, ..]
    frame: all five places read causal, the forward and the backward's recomputations alike."""
    module = read_hlo_file(next((RUN / "hlo").glob("*jit_train_step*.after_optimizations.txt")))
    masks = [pm.shapes.mask for pm in find_patterns(module) if pm.pattern == "attention"]
    assert masks == ["causal"] * 5, masks


def test_a_copy_in_async_pieces_is_the_array_it_copies():
    """`custom-call.10` (ConcatBitcast) joins four async slices of columns 0-511, ..., 1536-2047 of
    `copy-done.5`, itself an async copy of the mask `iota_compare_fusion.6`."""
    from tpudiag.analyze.hlo.dataflow import Dataflow

    module = read_hlo_file(next((RUN / "hlo").glob("*jit_train_step*.after_optimizations.txt")))
    flow = Dataflow(module)
    assert flow.whole_copy_of(module.instruction("custom-call.10")).name == "iota_compare_fusion.6"
    piece = module.instruction("slice-done.4")  # one piece alone is no copy of the whole
    assert flow.whole_copy_of(piece) is piece
