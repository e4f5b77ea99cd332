"""`tpudiag estimate` against ten published TPU results: the bundled fixture and MaxText's own step.

Each row is a published run: its source, its configuration, its figure. For each row the bench
runs `tpudiag estimate --json` in a subprocess, on the bundled fixture program where one models the
run (`fixtures/programs/llama_train.py`, `llama_decode.py`) and on MaxText's own step
(`maxtext:MODEL`, the `maxtext` package's train step with the run's own overrides) where MaxText
trains it, and prints the published figure, each estimate, their ratio, the peak HBM per device
(the compiler's memory analysis), whether it fits, the compile's wall time and the peak RSS of its
largest process (`os.wait4`). The run's own compiler flags are passed as LIBTPU_INIT_ARGS, less
the ones this libtpu refuses (said per row); the runs' chip configuration flag
(`--2a886c8_chip_config_name=X`, refused as a flag) becomes the target's chip configuration
(`--target T@X`), which libtpu's compile-only topology takes by name; the fixture's compile leaves out the run's
host-offload scheduling and SparseCore flags (it offloads nothing). Where the fixture and MaxText's step differ in peak
HBM by more than 10%, the largest buffers live at each one's peak are printed side by side.

Nothing is fitted: every estimate is the compile-only client's output read through the documented
model (docs/estimate.md). The bench never asserts; it prints the table and writes `results.json`.

    # MaxText rows need Python >= 3.12 with `pip install '.[tpu,maxtext]'` (or the venv in
    # fixtures/programs/thirdparty/maxtext-requirements.txt); fixture rows run anywhere
    python bench/fidelity.py [--only KEY ...] [--skip maxtext|fixture] [--keep DIR]

Rows (sources: AI-Hypercomputer/maxtext and AI-Hypercomputer/tpu-recipes; the commit each pins):
  32b-v5p  MaxText's 32B train, v5p-128 (64 chips), sequence 2048, 6/device, remat minimal, fsdp 16 x
           tensor 4: 328 TFLOP/s/chip, 71.47% MFU (maxtext 0.2.5 configs/tpu/v5p/README.md; the run
           is its configs/tpu/v5p/32b.sh: global_parameter_scale=32)
  32b-v5e  MaxText's 32B train, v5e-256, sequence 2048, 4/device, full remat, fsdp 256: 132
           TFLOP/s/chip, 66.86% MFU (maxtext 0.2.5 configs/tpu/v5e/README.md and 32b.sh)
  32b-v5p-b7  the same at 7/device, the batch of that recipe before (MaxText configs/v5p/32b.sh @
           0d9779a): memory only, the question being whether it fits
  8b-256   Llama 3.1 8B train, v6e-256: 4.546 s, 417.4 TFLOP/s/device, 7,207 tokens/s/device
           (tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-256/README.md; MaxText config
           llama3_1_8b_8192, benchmarks/maxtext_trillium_model_configs.py @ tpu-recipes-v0.1.4)
  8b-8     Llama 3.1 8B train, v6e-8: 3.443 s, 413.4 TFLOP/s/device, 7,139 tokens/s/device
           (tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md;
           llama3_1_8b_8192_no_collective_matmul)
  mixtral  Mixtral 8x7B train, v6e-256, token dropping: 13.48 s, 302.3 TFLOP/s/device, 3,645
           tokens/s/device (tpu-recipes training/trillium/Mixtral-8x7B-MaxText/README.md;
           mixtral_8x7b_dropped @ tpu-recipes-v0.1.2)
  ds3      DeepSeek V3 671B train, v5p-1024 (512 chips): 90.67 s, 152.4 TFLOP/s/device, 542.1
           tokens/s/device (tpu-recipes training/v5p/DeepSeek3-671B-MaxText/README.md;
           deepseek3_671b_v5p_1024, benchmarks/maxtext_v5p_model_configs.py @ 3eb77db)
  22b      MaxText's 22B on v4-128 (64 chips): 156 TFLOP/s/chip, 56.7% MFU (MaxText
           configs/tpu/v4/README.md; the run is MaxText/configs/1xv4-128.sh @ 281e04bf3, 2023:
           scale=3 of that day's base.yml, sequence 1024, batch 16, full remat, dot-product attention)
  70b-7x   Llama 3.1 70B train, 64 TPU7x chips (tpu7x-128), global batch 256, sequence 8192:
           12.20 s, 1,207 TFLOP/s/chip, 2,687 tokens/s/chip (tpu-recipes training/ironwood/README.md;
           llama3.1-70b/8k-bf16-tpu7x-4x4x4/xpk/run_recipe.sh)
  qwen3-7x Qwen3 235B-A22B train, 256 TPU7x chips (tpu7x-512), global batch 8192, sequence 4096:
           30.87 s, 629.8 TFLOP/s/chip, 4,246 tokens/s/chip (same README; qwen3-235b-a22b/
           4k-bf16-tpu7x-4x8x8/xpk/run_recipe.sh @ 1302a86)
  70b-dec  Llama 3.3 70B serving with vLLM on v6e-8, TP 8, 64 concurrent requests, 1k in / 1k out:
           25.35 ms time per output token (tpu-recipes inference/trillium/vLLM/Llama3.x/README.md).
           One decode step of 64 sequences at the run's mean context (1,000 + 500 = 1,500
           positions), the cache paged as vLLM keeps it (max-model-len 2048).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]

# --- the runs' compiler flags (MaxText benchmarks/xla_flags_library.py, expanded at the pinned commit)

_V6E_DENSE = [  # DENSE_VMEM_LIMIT + LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP + CF_FOR_ALL_GATHER
    "--xla_tpu_scoped_vmem_limit_kib=98304", "--xla_tpu_use_minor_sharding_for_major_trivial_input=true",
    "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1", "--xla_tpu_assign_all_reduce_scatter_layout=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true", "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true", "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true", "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
]
_SC_ALL_REDUCE = [  # ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE
    "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false",
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true", "--xla_tpu_enable_all_reduce_offload_tracing=true",
    "--xla_tpu_use_tc_device_shape_on_sc=true", "--xla_sc_enable_instruction_fusion=false", "--xla_sc_disjoint_spmem=false",
    "--xla_sc_disable_megacore_partitioning=true", "--2a886c8_chip_config_name=megachip_tccontrol",
]
_HOST_OFFLOAD = [  # HOST_OFFLOAD_FLAGS
    "--xla_tpu_enable_all_experimental_scheduler_features=true", "--xla_tpu_enable_scheduler_memory_pressure_tracking=true",
    "--xla_tpu_host_transfer_overlap_limit=24", "--xla_tpu_aggressive_opt_barrier_removal=ENABLED",
    "--xla_lhs_prioritize_async_depth_over_stall=ENABLED", "--xla_tpu_enable_ag_backward_pipelining=true",
    "--xla_should_allow_loop_variant_parameter_in_chain=ENABLED", "--xla_should_add_loop_invariant_op_in_chain=ENABLED",
    "--xla_max_concurrent_host_send_recv=100", "--xla_tpu_scheduler_percent_shared_memory_limit=100",
    "--xla_latency_hiding_scheduler_rerun=2",
]
LLAMA_8B_FLAGS = _V6E_DENSE + _SC_ALL_REDUCE + _HOST_OFFLOAD
MIXTRAL_FLAGS = [  # MOE_VMEM_LIMIT + CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP
    "--xla_tpu_scoped_vmem_limit_kib=81920", "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true", "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true", "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
]
DS3_FLAGS = [  # ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR + HOST_OFFLOAD + LAYOUT_FOR_ALL_REDUCE_SCATTER + ...
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=false",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false",
    "--xla_tpu_enable_async_collective_fusion_fuse_reduce_scatter=false",
    "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true",
    "--xla_tpu_enable_sparse_core_collective_offload_reduce_scatter=true",
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true", "--xla_tpu_enable_all_gather_offload_tracing=true",
    "--xla_tpu_enable_reduce_scatter_offload_tracing=true", "--xla_tpu_enable_all_reduce_offload_tracing=true",
    "--xla_tpu_use_tc_device_shape_on_sc=true", "--xla_sc_enable_instruction_fusion=false", "--xla_sc_disjoint_spmem=false",
    "--xla_sc_disable_megacore_partitioning=true", "--2a886c8_chip_config_name=megachip_tccontrol",
    *_HOST_OFFLOAD,
    "--xla_tpu_use_minor_sharding_for_major_trivial_input=true",
    "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1", "--xla_tpu_assign_all_reduce_scatter_layout=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true", "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_scoped_vmem_limit_kib=81920", "--xla_tpu_megacore_fusion_allow_ags=false",
    "--xla_enable_async_collective_permute=true",
]
LLAMA_70B_7X_FLAGS = [
    "--xla_tpu_scoped_vmem_limit_kib=61440", "--xla_tpu_bf16_emission_mode=NATIVE_EMISSION",
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true",
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true",
]
QWEN3_7X_FLAGS = [
    "--xla_tpu_scoped_vmem_limit_kib=61440", "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true",
    "--xla_tpu_enable_sparse_core_collective_offload_all_reduce=true",
    "--xla_tpu_use_single_sparse_core_for_all_gather_offload=true", *_HOST_OFFLOAD,
]

# Flags the public libtpu here (0.0.50) refuses off a v5e, with what it said; they are left out and the row says so.
REFUSED = {
    "--xla_tpu_enable_async_collective_fusion=true": "libtpu 0.0.50 on v6e: 'Continuation fusion for AllGather "
                                                     "... is not supported/recommended on platforms other than TPU v5e'",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true": "(the same continuation fusion)",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true": "(the same continuation fusion)",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false": "(the same continuation fusion)",
}

_SA_2048 = ["sa_block_q=2048", "sa_block_kv=2048", "sa_block_kv_compute=2048", "sa_block_q_dkv=2048",
            "sa_block_kv_dkv=2048", "sa_block_kv_dkv_compute=2048", "sa_block_q_dq=2048", "sa_block_kv_dq=2048"]
_LLAMA_8B_MAXTEXT = ["ici_fsdp_parallelism=-1", "remat_policy=custom", "decoder_layer_input=offload",
                     "out_proj=offload", "query_proj=offload", "key_proj=offload", "value_proj=offload",
                     "max_target_length=8192", "attention=flash", "use_iota_embed=True", *_SA_2048,
                     "sa_use_fused_bwd_kernel=True"]
_LLAMA_8B_FIXTURE = ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                     "--d-ff", "14336", "--vocab", "128256", "--seq", "8192", "--remat", "full", "--attention", "flash"]

# MaxText's configs/v5p/32b.sh: its LIBTPU_INIT_ARGS (the first ten, which both versions below share)
V5P_32B_FLAGS = [
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true", "--xla_tpu_megacore_fusion_allow_ags=false",
    "--xla_enable_async_collective_permute=true", "--xla_tpu_enable_ag_backward_pipelining=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true", "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true", "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true", "--xla_enable_async_all_gather=true",
]
# ... and configs/tpu/v5e/32b.sh's
V5E_32B_FLAGS = [
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true", "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true", "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true", "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
]
_32B = ["--layers", "32", "--d-model", "8192", "--heads", "64", "--kv-heads", "64", "--head-dim", "128",
        "--d-ff", "28672", "--vocab", "32000", "--seq", "2048", "--attention", "flash"]
_32B_MAXTEXT = ["global_parameter_scale=32", "remat_policy=minimal", "ici_fsdp_parallelism=-1", "ici_tensor_parallelism=4",
                "max_target_length=2048", "use_iota_embed=true", "attention=flash", "quantization="]



def _v5p_32b(batch: int, what: str) -> dict:
    return {"what": what, "published": {"tflops_per_chip": 328.0, "mfu": 0.7147}, "target": "v5p-128",
            "flags": V5P_32B_FLAGS,
            "fixture": {"entry": "fixtures/programs/llama_train.py:step", "mesh": "fsdp=16,tensor=4",
                        "args": [*_32B, "--remat", "minimal", "--batch-per-device", str(batch)]},
            "maxtext": {"entry": "maxtext:default", "args": [f"per_device_batch_size={batch}", *_32B_MAXTEXT]}}


ROWS = {
    "32b-v5p": _v5p_32b(6, "MaxText's 32B train, v5p-128 (64 chips), seq 2048, 6/device, remat minimal, fsdp 16 x "
                           "tensor 4 (maxtext 0.2.5 configs/tpu/v5p/32b.sh)"),
    "32b-v5p-b7": _v5p_32b(7, "the same at 7/device, the batch of the recipe's earlier version (MaxText "
                              "configs/v5p/32b.sh @ 0d9779a)"),
    "32b-v5e": {
        "what": "MaxText's 32B train, v5e-256, seq 2048, 4/device, remat full, fsdp 256 (maxtext 0.2.5 "
                "configs/tpu/v5e/32b.sh)",
        "published": {"tflops_per_chip": 132.0, "mfu": 0.6686},
        "target": "v5e-256", "flags": V5E_32B_FLAGS,
        "fixture": {"entry": "fixtures/programs/llama_train.py:step", "mesh": "fsdp=256",
                    "args": [*_32B, "--remat", "full", "--batch-per-device", "4"]},
        "maxtext": {"entry": "maxtext:default", "args": [
            "per_device_batch_size=4", "global_parameter_scale=32", "remat_policy=full", "max_target_length=2048",
            "use_iota_embed=true", "attention=flash"]},
    },
    "8b-256": {
        "what": "Llama 3.1 8B train, v6e-256, seq 8192, 4/device (MaxText llama3_1_8b_8192)",
        "published": {"step_s": 4.546, "tflops_per_chip": 417.4, "tokens_per_s_per_chip": 7207.0},
        "target": "v6e-256", "flags": LLAMA_8B_FLAGS,
        "fixture": {"entry": "fixtures/programs/llama_train.py:step",
                    "args": [*_LLAMA_8B_FIXTURE, "--batch-per-device", "4"]},
        "maxtext": {"entry": "maxtext:llama3.1-8b", "args": ["per_device_batch_size=4", *_LLAMA_8B_MAXTEXT]},
    },
    "8b-8": {
        "what": "Llama 3.1 8B train, v6e-8, seq 8192, 3/device (MaxText llama3_1_8b_8192_no_collective_matmul)",
        "published": {"step_s": 3.443, "tflops_per_chip": 413.4, "tokens_per_s_per_chip": 7139.0},
        "target": "v6e-8", "flags": LLAMA_8B_FLAGS + ["--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000"],
        "fixture": {"entry": "fixtures/programs/llama_train.py:step",
                    "args": [*_LLAMA_8B_FIXTURE, "--batch-per-device", "3"]},
        "maxtext": {"entry": "maxtext:llama3.1-8b", "args": ["per_device_batch_size=3", *_LLAMA_8B_MAXTEXT]},
    },
    "mixtral": {
        "what": "Mixtral 8x7B train, v6e-256, seq 4096, 12/device, dropping (MaxText mixtral_8x7b_dropped)",
        "published": {"step_s": 13.484, "tflops_per_chip": 302.3, "tokens_per_s_per_chip": 3645.0},
        "target": "v6e-256", "flags": MIXTRAL_FLAGS,
        "maxtext": {"entry": "maxtext:mixtral-8x7b", "args": [
            "per_device_batch_size=12", "ici_fsdp_parallelism=-1", "max_target_length=4096", "remat_policy=custom",
            "decoder_layer_input=offload", "out_proj=offload", "query_proj=offload", "key_proj=offload",
            "value_proj=offload", "attention=flash", "use_iota_embed=True", "sa_block_q=2048", "sa_block_q_dkv=2048",
            "sa_block_q_dq=2048", "megablox=False", "sparse_matmul=False", "capacity_factor=1.25"]},
    },
    "ds3": {
        "what": "DeepSeek V3 671B train, v5p-1024 (512 chips), seq 8192, 6/device (MaxText deepseek3_671b_v5p_1024)",
        "published": {"step_s": 90.668, "tflops_per_chip": 152.4, "tokens_per_s_per_chip": 542.1},
        "target": "v5p-1024", "flags": DS3_FLAGS,
        "maxtext": {"entry": "maxtext:deepseek3-671b", "args": [
            "ici_fsdp_parallelism=-1", "ici_tensor_parallelism=1", "per_device_batch_size=6",
            "max_target_length=8192", "dtype=bfloat16", "weight_dtype=float32", "megablox=True", "sparse_matmul=True",
            "scan_layers=True", "use_custom_sort_vjp=True", *_SA_2048, "remat_policy=custom",
            "decoder_layer_input=offload", "out_proj=offload",
            # The run's tile_batch_seq=512 tile_embed_dim=1024 tile_mlp_dim=1024: maxtext 0.2.5 has one
            # tile per pass instead (wi_/wo_tile_{fwd,dlhs,drhs}_*), whose defaults are those values.
            "sa_use_fused_bwd_kernel=False"]},
    },
    "22b": {
        "what": "MaxText 22B train, v4-128 (64 chips), seq 1024, 16/device, full remat (MaxText 1xv4-128.sh, 2023)",
        "published": {"tflops_per_chip": 156.0, "mfu": 0.567},
        "target": "v4-128", "flags": ["--xla_enable_async_all_gather=true"],
        "maxtext": {"entry": "maxtext:default", "args": [
            "base_emb_dim=6144", "base_num_query_heads=24", "base_num_kv_heads=24", "head_dim=256",
            "base_mlp_dim=24576", "base_num_decoder_layers=48", "mlp_activations=[relu]", "logits_via_embedding=True",
            "vocab_size=32768", "max_target_length=1024", "attention=dot_product", "per_device_batch_size=16",
            "remat_policy=full", "ici_fsdp_parallelism=64", "dcn_data_parallelism=1"]},
    },
    "70b-7x": {
        "what": "Llama 3.1 70B train, 64 TPU7x chips, global batch 256, seq 8192 (tpu-recipes Ironwood)",
        "published": {"step_s": 12.20, "tflops_per_chip": 1207.05, "tokens_per_s_per_chip": 2686.98},
        "target": "tpu7x-128", "flags": LLAMA_70B_7X_FLAGS,
        "maxtext": {"entry": "maxtext:llama3.1-70b", "args": [
            "dtype=bfloat16", "per_device_batch_size=2", "use_iota_embed=True", "remat_policy=custom",
            "decoder_layer_input=device", "context=device", "query_proj=device", "key_proj=device",
            "value_proj=device", "qkv_proj=device", "ici_fsdp_parallelism=-1", "opt_type=adamw", "mu_dtype=bfloat16",
            "sa_block_q=2048", "sa_block_kv=2048", "sa_block_kv_compute=2048", "sa_block_q_dkv=2048",
            "sa_block_kv_dkv=2048", "sa_block_kv_dkv_compute=2048", "sa_q_layout=SEQ_MINOR", "sa_k_layout=SEQ_MINOR",
            "sa_v_layout=HEAD_DIM_MINOR", "sa_use_fused_bwd_kernel=True", "use_tokamax_splash=True",
            "max_target_length=8192", "attention=flash"]},
    },
    "qwen3-7x": {
        "what": "Qwen3 235B-A22B train, 256 TPU7x chips, global batch 8192, seq 4096 (tpu-recipes Ironwood)",
        "published": {"step_s": 30.87, "tflops_per_chip": 629.79, "tokens_per_s_per_chip": 4245.89},
        "target": "tpu7x-512", "flags": QWEN3_7X_FLAGS,
        "maxtext": {"entry": "maxtext:qwen3-235b-a22b", "args": [
            "per_device_batch_size=16", "max_target_length=4096", "dtype=bfloat16", "weight_dtype=float32",
            "opt_type=adamw", "remat_policy=custom", "decoder_layer_input=offload", "use_custom_sort_vjp=True",
            # The run sets use_random_routing=True (its config: "for debug/test purpose"); maxtext 0.2.5
            # refuses it without expert parallelism ("When EP rank is 1, use_random_routing must be
            # False"). Left out: the router's choices differ, the compiled dropless MoE does not.
            "shard_exp_on_fsdp=False", "megablox=False", "sparse_matmul=True",
            "use_tokamax_gmm=True", "use_tokamax_splash=True", "sa_use_fused_bwd_kernel=True", "attention=flash",
            "sa_block_q=1024", "sa_block_kv=1024", "sa_block_kv_compute=512", "sa_block_q_dkv=2048",
            "sa_block_kv_dkv=2048", "sa_block_kv_dkv_compute=1024", "sa_block_q_dq=1024", "sa_block_kv_dq=1024",
            "sa_q_layout=HEAD_DIM_MINOR", "sa_k_layout=SEQ_MINOR", "sa_v_layout=HEAD_DIM_MINOR",
            "dcn_pipeline_parallelism=1", "dcn_data_parallelism=-1", "ici_pipeline_parallelism=1",
            "ici_fsdp_transpose_parallelism=1", "ici_fsdp_parallelism=-1"]},
    },
    "70b-dec": {
        "what": "Llama 3.3 70B decode, v6e-8, TP 8, 64 requests, 1k in / 1k out (vLLM)",
        "published": {"time_per_output_token_s": 25.35e-3},
        "target": "v6e:2x4", "flags": [],
        "fixture": {"entry": "fixtures/programs/llama_decode.py:step", "mesh": "tensor=8", "args": [
            "--layers", "80", "--d-model", "8192", "--heads", "64", "--kv-heads", "8", "--head-dim", "128",
            "--d-ff", "28672", "--vocab", "128256", "--context", "1500", "--batch", "64", "--cache", "paged",
            "--max-len", "2048", "--page-size", "64"]},
    },
}


# The fixture offloads nothing to host and uses no SparseCore collectives: the run's host-offload
# scheduling and SparseCore flags are MaxText's program's, left out of the fixture's compile.
NOT_FOR_FIXTURE = set(_HOST_OFFLOAD + _SC_ALL_REDUCE)


# The runs' chip configuration flag, which the public libtpu refuses as a flag; libtpu's compile-only
# topology takes the same configuration by name (`--target T@CONFIG`), so the row's target carries it.
CHIP_CONFIG_FLAG = "--2a886c8_chip_config_name="


def _target(row: dict) -> str:
    config = [f[len(CHIP_CONFIG_FLAG):] for f in row["flags"] if f.startswith(CHIP_CONFIG_FLAG)]
    return f"{row['target']}@{config[0]}" if config else row["target"]


def _flags(row: dict, kind: str) -> tuple[str, list[str]]:
    flags = [f for f in row["flags"] if (kind == "maxtext" or f not in NOT_FOR_FIXTURE)
             and not f.startswith(CHIP_CONFIG_FLAG)]
    # continuation fusion is the v5e's own: kept there, refused elsewhere
    refused = set() if row["target"].startswith("v5e") else set(REFUSED)
    kept = [f for f in flags if f not in refused]
    return " ".join(kept), [f for f in flags if f in refused]


def run_one(key: str, kind: str, root: Path, timeout_s: float, cache: bool = False) -> dict:
    row, spec = ROWS[key], ROWS[key][kind]
    flags, dropped = _flags(row, kind)
    env = dict(os.environ, LIBTPU_INIT_ARGS=flags)
    env.pop("XLA_FLAGS", None)
    out_dir = root / f"{key}-{kind}"
    # --no-cache: every run compiles, so that its wall time and memory are the compile's own
    shutil.rmtree(out_dir, ignore_errors=True)
    # --compile-timeout counts CPU seconds: the compile uses both cores of this machine
    cmd = [*TPUDIAG, "estimate", spec["entry"], "--target", _target(row), "--json", *([] if cache else ["--no-cache"]),
           "--out", str(out_dir), "--compile-timeout", str(int(timeout_s * 2)),
           *(["--mesh", spec["mesh"]] if spec.get("mesh") else []), "--", *spec["args"]]
    shown = " ".join(cmd[len(TPUDIAG):])
    print(f"$ LIBTPU_INIT_ARGS='<{len(flags.split())} flags>' tpudiag {shown}", flush=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        text, errtext = out.read().decode(), err.read().decode()
    res = {"row": key, "kind": kind, "command": f"tpudiag {shown}", "libtpu_init_args": flags, "dropped_flags": dropped,
           "wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024, "exit": os.waitstatus_to_exitcode(status),
           "run_dir": str(out_dir)}
    try:
        res["estimate"] = json.loads(text)
    except json.JSONDecodeError:
        res["error"] = (errtext.strip().splitlines() or [f"exit {res['exit']}, no output"])[-1][:400]
        return res
    res["peak_buffers"] = res["estimate"].get("peak_buffers") or []
    return res


def figures(res: dict) -> dict:
    """Per-chip figures from an estimate (TPU7x has two devices a chip; published rows count chips)."""
    d = res.get("estimate") or {}
    if d.get("step_s") is None:
        return {}
    per_chip = int(d["target"].get("devices", 1)) // max(1, int(d["target"].get("chips", 1)))
    devices = int(d["target"]["devices"])
    chips = devices // per_chip
    out = {"step_s": d["step_s"], "tokens_per_s_per_chip": d["tokens"] / d["step_s"] / chips}
    if d.get("model_flops"):
        out["tflops_per_chip"] = d["model_flops"] / d["step_s"] / chips / 1e12
    if d.get("mfu") is not None:
        out["mfu"] = d["mfu"]
    return out


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if key == "step_s":
        return f"{v:.3f} s" if v >= 0.1 else f"{v * 1e3:.2f} ms"
    if key == "time_per_output_token_s":
        return f"{v * 1e3:.2f} ms"
    if key == "mfu":
        return f"{v:.1%}"
    return f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"


def table(results: list[dict]) -> str:
    lines = ["| row | figure | published | fixture | ratio | MaxText's step | ratio | peak HBM/device (fixture; MaxText) "
             "| fits | compile wall, peak RSS |", "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    by = {(r["row"], r["kind"]): r for r in results}
    for key, row in ROWS.items():
        runs = {k: by.get((key, k)) for k in ("fixture", "maxtext")}
        if not any(runs.values()):
            continue
        figs = {k: (figures(r) if r else {}) for k, r in runs.items()}
        if "time_per_output_token_s" in row["published"]:
            figs = {k: ({"time_per_output_token_s": f["step_s"]} if f else {}) for k, f in figs.items()}
        mem, fits, cost = [], [], []
        for k in ("fixture", "maxtext"):
            r = runs[k]
            d = (r or {}).get("estimate") or {}
            if r is None:
                mem.append("-"), fits.append("-"), cost.append("-")
                continue
            mem.append(f"{d['peak_hbm_bytes'] / 2**30:.1f} GiB" if d.get("peak_hbm_bytes") else
                       (r.get("error") or "-")[:80])
            fits.append({True: "yes", False: "**no**", None: "-"}[d.get("fits")])
            cost.append(f"{r['wall_s'] / 60:.1f} min, {r['peak_rss_bytes'] / 2**30:.2f} GiB")
        first = True
        for fig, pub in row["published"].items():
            cells = []
            for k in ("fixture", "maxtext"):
                v = figs[k].get(fig)
                cells += [_fmt(fig, v), f"{v / pub:.2f}x" if v else "-"]
            lines.append(f"| {key if first else ''} | {fig} | {_fmt(fig, pub)} | {' | '.join(cells)} | "
                         f"{'; '.join(mem) if first else ''} | {'; '.join(fits) if first else ''} | "
                         f"{'; '.join(cost) if first else ''} |")
            first = False
    return "\n".join(lines)


def buffers_side_by_side(results: list[dict]) -> str:
    """Where the fixture's and MaxText's peak HBM differ by more than 10%: each one's largest buffers."""
    out = []
    by = {(r["row"], r["kind"]): r for r in results}
    for key in ROWS:
        f, m = by.get((key, "fixture")), by.get((key, "maxtext"))
        if not (f and m and (f.get("estimate") or {}).get("peak_hbm_bytes") and (m.get("estimate") or {}).get("peak_hbm_bytes")):
            continue
        a, b = f["estimate"]["peak_hbm_bytes"], m["estimate"]["peak_hbm_bytes"]
        if abs(a - b) / b <= 0.10:
            continue
        out.append(f"{key}: peak HBM fixture {a / 2**30:.1f} GiB, MaxText {b / 2**30:.1f} GiB; largest live at each peak:")
        for name, r in (("fixture", f), ("MaxText", m)):
            for buf in r.get("peak_buffers", [])[:8]:
                out.append(f"  {name:8s} {buf['bytes'] / 2**30:7.2f} GiB  x{buf['count']:<4d} {buf['kind']:10s} {buf['where']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(ROWS), default=None)
    parser.add_argument("--skip", choices=("fixture", "maxtext"), default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories and results.json here")
    parser.add_argument("--cache", action="store_true",
                        help="use the compile cache (default off: each row's wall time and memory are its compile's)")
    parser.add_argument("--skip-done", action="store_true", help="keep rows already in DIR/results.json")
    parser.add_argument("--timeout", type=float, default=1200.0, help="wall seconds per estimate (default 20 min)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-fidelity-"))
    root.mkdir(parents=True, exist_ok=True)
    results_path = root / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else []
    for key in args.only or list(ROWS):
        for kind in ("fixture", "maxtext"):
            if kind not in ROWS[key] or kind == args.skip:
                continue
            results = json.loads(results_path.read_text()) if results_path.is_file() else results
            if args.skip_done and any((r["row"], r["kind"]) == (key, kind) and "estimate" in r for r in results):
                continue
            res = run_one(key, kind, root, args.timeout, args.cache)
            d = res.get("estimate") or {}
            print(f"  {key} {kind}: {d.get('status', 'error')} step {d.get('step_s')} peak HBM "
                  f"{(d.get('peak_hbm_bytes') or 0) / 2**30:.1f} GiB fits {d.get('fits')} "
                  f"wall {res['wall_s']:.0f} s RSS {res['peak_rss_bytes'] / 2**30:.2f} GiB"
                  f"{'  ' + res['error'] if 'error' in res else ''}", flush=True)
            results = json.loads(results_path.read_text()) if results_path.is_file() else results  # another run may have written
            results = [r for r in results if (r["row"], r["kind"]) != (key, kind)] + [res]
            results_path.write_text(json.dumps(results, indent=1) + "\n")
    print()
    print(table(results))
    side = buffers_side_by_side(results)
    if side:
        print()
        print(side)
    print(f"\nresults: {results_path}")


if __name__ == "__main__":
    main()
