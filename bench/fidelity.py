"""`tpudiag estimate` against published TPU results: the estimate, the published figure, the ratio.

Runs `tpudiag estimate --json` in a subprocess for each published configuration and prints, side
by side, the published figure, tpudiag's estimate and their ratio, with the wall time and the
peak memory (the largest process of the estimate, from `os.wait4`). The compiler flags are the
published run's own (MaxText's `xla_flags` for its config, passed as LIBTPU_INIT_ARGS).

1. Llama 3.1 8B training on v6e-256, sequence 8192, 4 sequences per device, FSDP over the 256
   chips. MaxText (AI-Hypercomputer/maxtext `docs/reference/models/tiering.md`; config
   `llama3_1_8b_8192` in `benchmarks/maxtext_trillium_model_configs.py`): 45.46% MFU, about
   7,207 tokens/s/device.
2. Llama 3.3 70B serving on v6e-8, tensor parallel 8, 1k input / 1k output at 64 concurrent
   requests: 25.35 ms time per output token (AI-Hypercomputer/tpu-recipes,
   `inference/trillium/vLLM/Llama3.x/README.md`). One decode step of 64 sequences at the mean
   context of that run (1,024 input + 512 of the 1,024 output tokens = 1,536 positions).

Never asserts; prints the table.

    python bench/fidelity.py [--only 8b|70b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "tpudiag"
TPUDIAG = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tpudiag"]

# MaxText's llama3_1_8b_8192 xla_flags (benchmarks/xla_flags_library.py) that bear on this program:
# DENSE_VMEM_LIMIT_FLAG, LAYOUT_FOR_ALL_REDUCE_SCATTER, DATA_PARALLEL_OVERLAP, CF_FOR_ALL_GATHER.
# Left out: HOST_OFFLOAD_FLAGS (they schedule the published run's activation offload to host,
# which this program does not do; with them the compile ran past 16 minutes here) and
# ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE (not in the library version read).
MAXTEXT_8B_FLAGS = " ".join([
    "--xla_tpu_scoped_vmem_limit_kib=98304",
    "--xla_tpu_use_minor_sharding_for_major_trivial_input=true",
    "--xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1",
    "--xla_tpu_assign_all_reduce_scatter_layout=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
])

CASES = {
    "8b": {
        "what": "Llama 3.1 8B train, v6e-256, seq 8192, 4/device, FSDP 256 (MaxText)",
        "entry": "fixtures/programs/llama_train.py:step", "target": "v6e-256", "mesh": None,
        "args": ["--layers", "32", "--d-model", "4096", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                 "--d-ff", "14336", "--vocab", "128256", "--seq", "8192", "--batch-per-device", "4",
                 "--remat", "full", "--attention", "flash"],
        "libtpu": MAXTEXT_8B_FLAGS,
        "published": {"mfu": 0.4546, "tokens_per_s_per_device": 7207.0},
    },
    "70b": {
        "what": "Llama 3.3 70B decode, v6e-8, TP 8, 64 requests, 1k in / 1k out (vLLM)",
        "entry": "fixtures/programs/llama_decode.py:step", "target": "v6e:2x4", "mesh": "tensor=8",
        "args": ["--layers", "80", "--d-model", "8192", "--heads", "64", "--kv-heads", "8", "--head-dim", "128",
                 "--d-ff", "28672", "--vocab", "128256", "--context", "1536", "--batch", "64"],
        "libtpu": "",
        "published": {"time_per_output_token_s": 25.35e-3},
    },
}


def run_case(name: str, root: Path) -> dict:
    case = CASES[name]
    env = dict(os.environ, LIBTPU_INIT_ARGS=case["libtpu"])
    env.pop("XLA_FLAGS", None)
    # --no-cache: every run compiles, so that its wall time and memory are the compile's own
    cmd = [*TPUDIAG, "estimate", case["entry"], "--target", case["target"], "--json", "--no-cache", "--out", str(root / name),
           *(["--mesh", case["mesh"]] if case["mesh"] else []), "--", *case["args"]]
    print("$", ("LIBTPU_INIT_ARGS='...' " if case["libtpu"] else "") + " ".join(cmd[len(TPUDIAG):]), flush=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if not text.strip():
            sys.exit(f"{name}: tpudiag estimate printed nothing (exit {os.waitstatus_to_exitcode(status)}):\n"
                     f"{err.read().decode()[-3000:]}")
    doc = json.loads(text)
    return {"doc": doc, "wall_s": wall, "peak_rss": usage.ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpudiag-fidelity-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in ([args.only] if args.only else list(CASES)):
        r = run_case(name, root)
        d = r["doc"]
        pub = CASES[name]["published"]
        print(f"  status {d['status']}, step {d['step_s']}, wall {r['wall_s']:.0f} s, peak RSS "
              f"{r['peak_rss'] / 2**30:.2f} GiB", flush=True)
        if "mfu" in pub:
            rows.append((CASES[name]["what"], "MFU", f"{pub['mfu']:.2%}",
                         f"{d['mfu']:.2%}" if d["mfu"] is not None else "-",
                         f"{d['mfu'] / pub['mfu']:.2f}x" if d["mfu"] else "-", r))
            tps = d["tokens_per_s_per_device"]
            rows.append(("", "tokens/s/device", f"{pub['tokens_per_s_per_device']:,.0f}",
                         f"{tps:,.0f}" if tps else "-", f"{tps / pub['tokens_per_s_per_device']:.2f}x" if tps else "-",
                         None))
        else:
            tpot = d["step_s"]
            p = pub["time_per_output_token_s"]
            rows.append((CASES[name]["what"], "time per output token", f"{p * 1e3:.2f} ms",
                         f"{tpot * 1e3:.2f} ms" if tpot else "-", f"{tpot / p:.2f}x" if tpot else "-", r))
    print("\n| configuration | figure | published | tpudiag estimate | estimate / published | wall | peak memory |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for what, fig, pub, est, ratio, r in rows:
        extra = f"{r['wall_s']:.0f} s | {r['peak_rss'] / 2**30:.2f} GiB" if r else " | "
        print(f"| {what} | {fig} | {pub} | {est} | {ratio} | {extra} |")
    for name in ([args.only] if args.only else list(CASES)):
        d = json.loads((root / name / "estimate.json").read_text()) if (root / name / "estimate.json").is_file() else {}
        if d.get("breakdown"):
            b = d["breakdown"]
            print(f"\n{name}: step {d['step_s'] * 1e3:.2f} ms = compute {b['compute_s'] * 1e3:.2f} + HBM "
                  f"{b['hbm_s'] * 1e3:.2f} + exposed collectives {b['collective_s'] * 1e3:.2f} ms "
                  f"(hidden {b['hidden_collective_s'] * 1e3:.2f}); HBM/device {d['peak_hbm_bytes'] / 2**30:.1f} GiB")
            for o in d["top_ops"][:5]:
                print(f"  {o['name']:32} {o['total_s'] * 1e3:8.2f} ms  {o['share']:6.1%}  {o['bound_by']:14} {o['limit']}")


if __name__ == "__main__":
    main()
