"""tpudiag's serving kernels against the kernels vLLM's TPU backend ships, at the same shapes and target.

The peer is `tpu-inference` (vLLM's TPU backend, Apache 2.0, https://github.com/vllm-project/tpu-inference)
0.32: its ragged paged attention v3, MLA v2, w8a8 quantized matmul and fused MoE v1, each in the "JAX
kernel" column of `tpudiag kernels bench` beside ours and XLA's lowering of the reference:

    ragged_paged_attention  <- kernels.ragged_paged_attention.v3 (KV write off: ours measures attention;
                               the cache is donated)
    mla_decode              <- kernels.mla.v2, called as its attention layer calls it (writes
                               the step's latent rows; the cache is donated)
    w8a8_matmul             <- kernels.quantized_matmul (x quantized to int8 per token, w [N, K])
    fused_moe               <- kernels.fused_moe.v1.fused_ep_moe (one-device mesh; router logits
                               computed outside it, as its caller does)

tpu-inference pins jax 0.11.2 and its package `__init__` imports vllm. Its kernels import only jax
and two helpers of the package (`logger.init_logger`, `utils.get_device_name`), so the bench loads
`tpu_inference.kernels` under a package shell that supplies those two, and tells the kernels the
target's TPU generation where they read it from `jax.devices()` (a CPU here). The kernel code is
tpu-inference's own, unmodified. Install: `pip install --no-deps tpu-inference==0.32.0` into the
venv with jax >= 0.11 and libtpu (the MaxText venv here).

    python bench/vs_tpu_inference.py --target v6e [--kernels fused_moe ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import math
import sys
import types
from pathlib import Path

KERNELS = ("ragged_paged_attention", "mla_decode", "w8a8_matmul", "fused_moe")


class _Logger(logging.Logger):
    """vllm's logger methods the kernels call."""

    def warning_once(self, msg, *args):
        self.warning(msg, *args)

    def info_once(self, msg, *args):
        self.info(msg, *args)

    def debug_once(self, msg, *args):
        self.debug(msg, *args)


def load_tpu_inference(generation: int, device_name: str) -> str:
    """Make `tpu_inference.kernels.*` importable without the package's `__init__` (which imports
    vllm); return the installed version."""
    from importlib.metadata import version

    found = importlib.util.find_spec("tpu_inference")
    if found is None:
        raise ImportError("tpu-inference is not installed (pip install --no-deps tpu-inference==0.32.0)")
    shell = types.ModuleType("tpu_inference")
    shell.__path__ = [str(Path(found.origin).parent)]
    sys.modules["tpu_inference"] = shell
    logger = types.ModuleType("tpu_inference.logger")
    logger.init_logger = lambda name: _Logger(name)
    utils = types.ModuleType("tpu_inference.utils")
    utils.get_device_name = lambda num_devices=None: device_name + (f"-{num_devices}" if num_devices else "")
    sys.modules.update({"tpu_inference.logger": logger, "tpu_inference.utils": utils})
    import tpu_inference.kernels.fused_moe.v1.kernel  # noqa: F401
    import tpu_inference.kernels.mla.v2.kernel  # noqa: F401
    import tpu_inference.kernels.quantized_matmul.kernel  # noqa: F401
    import tpu_inference.kernels.ragged_paged_attention.v3.kernel  # noqa: F401

    for name, module in list(sys.modules.items()):  # every copy of the generation probe, imported by name
        if name.startswith("tpu_inference.kernels") and hasattr(module, "get_tpu_version"):
            module.get_tpu_version = lambda: generation
    return version("tpu-inference")


def _rpa(target, ti_version):
    import jax
    import jax.numpy as jnp
    from tpu_inference.kernels.ragged_paged_attention.v3.kernel import ragged_paged_attention as ti_rpa

    from tpudiag.kernels import ragged_paged_attention as ours

    p = ours.PROD
    sds = jax.ShapeDtypeStruct
    pages = p["seqs"] * p["context"] // p["page_size"]
    t, h, kvh, d = p["tokens"], p["q_heads"], p["kv_heads"], p["head_dim"]
    args = (sds((t, h, d), jnp.bfloat16), sds((t, kvh, d), jnp.bfloat16), sds((t, kvh, d), jnp.bfloat16),
            sds((pages, p["page_size"], kvh, 2, d), jnp.bfloat16),  # K|V interleaved, bf16 packed in pairs
            sds((p["seqs"],), jnp.int32), sds((pages,), jnp.int32), sds((p["seqs"] + 1,), jnp.int32),
            sds((3,), jnp.int32))

    def peer(q, k, v, cache, kv_lens, page_indices, cu_q_lens, distribution):
        return ti_rpa(q, k, v, cache, kv_lens, page_indices, cu_q_lens, distribution, update_kv_cache=False,
                      sm_scale=1.0 / math.sqrt(d))  # (out, the cache, aliased: returned so donation holds)

    own = ours.bench()
    return ours.SPEC, dataclasses.replace(
        own, jax_kernel=peer, variant_args={**own.variant_args, "jax": args}, donate={"jax": (3,)},
        jax_name=f"tpu-inference {ti_version} ragged_paged_attention v3 (its tuned blocks, KV write off)")


def _mla(target, ti_version):
    """As tpu-inference's attention layer calls MLA v2: ql_nope [H, T, latent], q_pe [T, H, rope], its
    tuned parameters looked up by the same keys (its defaults where the table has no entry)."""
    import jax
    import jax.numpy as jnp
    from tpu_inference.kernels.mla.v2.kernel import get_kv_cache_shape, mla_ragged_paged_attention
    from tpu_inference.kernels.mla.v2.tuned_params import TuningKey, get_tuned_params

    from tpudiag.kernels import mla_decode as ours

    p = ours.PROD
    sds = jax.ShapeDtypeStruct
    b, h, lat, rope = p["batch"], p["heads"], p["latent"], p["rope"]
    pps = p["context"] // p["page_size"]
    cache = get_kv_cache_shape(p["pool"] * b * pps, p["page_size"], lat + rope, jnp.bfloat16)
    args = (sds((h, b, lat), jnp.bfloat16), sds((b, h, rope), jnp.bfloat16), sds((b, lat), jnp.bfloat16),
            sds((b, rope), jnp.bfloat16), sds(cache, jnp.bfloat16), sds((b,), jnp.int32),
            sds((b * pps,), jnp.int32), sds((b + 1,), jnp.int32), sds((3,), jnp.int32))
    tuned = {case: get_tuned_params(TuningKey(case=case, max_num_tokens=b, actual_num_q_heads=h, actual_lkv_dim=lat,
                                              actual_r_dim=rope, kv_dtype="bfloat16", q_dtype="bfloat16",
                                              page_size_per_kv_packing=cache[1], kv_packing=cache[2],
                                              max_num_seqs=b, pages_per_seq=pps))
             for case in ("batched_decode", "mixed")}
    decode, mixed = tuned["batched_decode"], tuned["mixed"]

    def peer(ql_nope, q_pe, new_kv_c, new_k_pe, cache_kv, kv_lens, page_indices, cu_q_lens, distribution):
        out, new_cache = mla_ragged_paged_attention(
            ql_nope, q_pe, new_kv_c, new_k_pe, cache_kv, kv_lens, page_indices, cu_q_lens, distribution,
            sm_scale=ours.PROD_SCALE,
            num_kv_pages_per_block=(decode.num_kv_pages_per_block, mixed.num_kv_pages_per_block,
                                    mixed.num_kv_pages_per_block),
            num_queries_per_block=(decode.num_queries_per_block, mixed.num_queries_per_block,
                                   mixed.num_queries_per_block),
            decode_batch_size=decode.decode_batch_size, mixed_q_split=mixed.q_split)
        return out, new_cache

    own = ours.bench()
    return ours.SPEC, dataclasses.replace(
        own, jax_kernel=peer, variant_args={**own.variant_args, "jax": args}, donate={"jax": (4,)},
        jax_name=(f"tpu-inference {ti_version} mla v2 (decode: {decode.num_kv_pages_per_block} pages a block, "
                  f"batch {decode.decode_batch_size}; writes the step's {b} rows)"))


def _w8a8(target, ti_version):
    import jax
    import jax.numpy as jnp
    from tpu_inference.kernels.quantized_matmul.kernel import quantized_matmul_kernel

    from tpudiag.kernels import w8a8_matmul as ours

    own = ours.bench()
    x, w, scale = own.args
    args = (x, jax.ShapeDtypeStruct((w.shape[1], w.shape[0]), w.dtype), scale)

    def peer(x, w_q, w_scale):
        return quantized_matmul_kernel(x, w_q, w_scale, x_q_dtype=jnp.int8)

    return ours.SPEC, dataclasses.replace(
        own, jax_kernel=peer, variant_args={**own.variant_args, "jax": args},
        jax_name=f"tpu-inference {ti_version} quantized_matmul (x int8 per token; its tuned blocks)")


def _moe(target, ti_version):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tpu_inference.kernels.fused_moe.v1.kernel import fused_ep_moe

    from tpudiag.kernels import fused_moe as ours
    from tpudiag.targets import topology_desc

    own = ours.bench()
    x, r, wg, _, wd = own.args
    e, d, f = wg.shape
    args = (x, r, jax.ShapeDtypeStruct((e, 2, d, f), wg.dtype), wd)
    mesh = jax.sharding.Mesh(np.array(topology_desc(target.topology).devices[:1]).reshape(1, 1), ("data", "model"))

    def peer(x, router_w, w1, w2):
        logits = jnp.dot(x, router_w, preferred_element_type=jnp.float32).astype(x.dtype)  # it takes bf16 logits
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # its shard_map's mesh, not the bench's
            return fused_ep_moe(mesh, x, w1, w2, logits, ours.PROD["top_k"], renormalize_topk_logits=True,
                                act_fn="silu", scoring_fn="softmax")

    return ours.SPEC, dataclasses.replace(
        own, jax_kernel=peer, variant_args={**own.variant_args, "jax": args},
        jax_name=f"tpu-inference {ti_version} fused_ep_moe v1 (one device; its default blocks)")


PEERS = {"ragged_paged_attention": _rpa, "mla_decode": _mla, "w8a8_matmul": _w8a8, "fused_moe": _moe}


def specs(target, ti_version, names):
    out = []
    for name in names:
        spec, setup = PEERS[name](target, ti_version)
        out.append(dataclasses.replace(spec, name=f"{name}_vs_tpu_inference", bench=lambda blocks=None, s=setup: s))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="v6e")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=400.0)
    args = parser.parse_args()

    from sweep_common import bench_specs, target_or_none

    target = target_or_none(args.target, "vs_tpu_inference")
    if target is None:
        return 2
    generation = int("".join(c for c in target.chip.name if c.isdigit()))
    try:
        ti_version = load_tpu_inference(generation, f"TPU {target.chip.name}")
    except ImportError as e:
        print(f"vs_tpu_inference: {e}", file=sys.stderr)
        return 2
    return bench_specs("vs_tpu_inference", specs(target, ti_version, args.kernels), args.target, args.out,
                       args.timeout)


if __name__ == "__main__":
    sys.exit(main())
