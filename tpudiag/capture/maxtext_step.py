"""MaxText's own training step, built through MaxText's ahead-of-time compile path, for `estimate`.

`tpudiag estimate maxtext:MODEL --target T -- key=value ...` runs `step(argv, mesh)` below in the
estimate worker: argv is `model_name=MODEL`, `compile_topology=...` (MaxText's name for the
target, e.g. `v6e-256`, `v5p-1024`, `tpu7x-128`) and the user's MaxText overrides
(`per_device_batch_size=4 remat_policy=full ...`, as on MaxText's command line). The step is the
one `maxtext/trainers/pre_train/train_compile.py` compiles: `pyconfig.initialize` on MaxText's
`base.yml` (`maxtext:default` is base.yml's own model, shaped by the overrides), `get_topology_mesh` (MaxText's mesh from its `ici_*`/`dcn_*` settings, not tpudiag's
`--mesh`), `get_shaped_inputs` (the abstract train state and batch), `train.train_step` under
`get_functional_train_with_signature`'s shardings and donation, lowered under MaxText's mesh and
logical axis rules. Nothing is allocated; data is MaxText's synthetic batch shape, checkpointing
is off. The model FLOPs are MaxText's own count (`calculate_tflops_training_per_device`), the one
its logs and the published TFLOP/s/device use.

Needs the `maxtext` package (Python >= 3.12, jax >= 0.11: `pip install 'tpudiag[maxtext]'`);
without it, or with a model MaxText does not ship, or an override MaxText refuses, the estimate
stops with one line (exit 2). jax and maxtext are imported inside `step`: the worker imports this
file before it knows it will call it.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re

from tpudiag.errors import InputError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")
# What the step needs from MaxText's configuration on a machine without data or GCS, set before
# the user's overrides (a user override wins).
_FIXED = ("run_name=tpudiag_estimate", "enable_checkpointing=False", "dataset_type=synthetic",
          "skip_jax_distributed_system=True", "compile_topology_num_slices=1")


def maxtext_topology(chip: str, chips: int, tensorcores_per_chip: int) -> str:
    """MaxText's `compile_topology` name for a slice: its accelerator_to_spec_map counts
    TensorCores (v5p-1024 is 512 chips, tpu7x-128 is 64), which is chips on v5e and v6e."""
    return f"{chip}-{chips * tensorcores_per_chip}"


def split_overrides(argv: list[str]) -> list[str]:
    """The user's `key=value` overrides, checked for form (MaxText checks the keys)."""
    out = []
    for a in argv:
        if not _KEY.match(a):
            raise InputError(f"maxtext: {a!r} is not a MaxText override (expected key=value, as in "
                             "per_device_batch_size=4)")
        out.append(a)
    return out


def _import_maxtext():
    try:
        from maxtext.configs import pyconfig  # noqa: F401
    except ImportError as e:
        raise InputError(f"maxtext: the maxtext package is not importable here ({e}); it needs Python >= 3.12 "
                         "and jax >= 0.11: pip install 'tpudiag[maxtext]'") from None


def _check_model(name: str) -> None:
    from maxtext.configs import pyconfig

    models = os.path.join(os.path.dirname(pyconfig.__file__), "models")
    shipped = sorted(f[:-4] for f in os.listdir(models) if f.endswith(".yml"))
    if name != "default" and name not in shipped:  # "default": base.yml's own model, set by overrides
        close = difflib.get_close_matches(name, shipped, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InputError(f"maxtext:{name}: MaxText ships no model config {name}.yml{hint}; see "
                         f"{models}")


def _config(argv: list[str]):
    from maxtext.configs import pyconfig

    base = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
    try:
        return pyconfig.initialize([None, base, *_FIXED, *argv])
    except (ValueError, TypeError, KeyError, AssertionError) as e:  # pydantic and omegaconf errors
        first = " ".join(str(e).split())[:400]
        raise InputError(f"maxtext: MaxText refused the configuration: {first}") from None


def _tokamax_cross_compile():
    """tokamax's kernels check the default device before they lower (and their gradients call
    kernels that check again), which is the CPU here: its `cross_compile` setting is its own switch
    for lowering on one machine what runs on another. Without tokamax, nothing to switch."""
    try:
        from tokamax import config as tokamax_config
    except ImportError:
        return contextlib.nullcontext()
    return tokamax_config.cross_compile(True)


def step(argv, mesh):
    """FUNC(argv, mesh) for the estimate worker: MaxText's lowered train step. `mesh` (tpudiag's)
    is not used: MaxText builds its own from the topology and its parallelism settings."""
    del mesh
    argv = list(argv)
    model = next((a.split("=", 1)[1] for a in argv if a.startswith("model_name=")), None)
    if not model:
        raise InputError("maxtext: no model_name (estimate maxtext:MODEL ...)")
    _import_maxtext()
    _check_model(model)

    import jax
    from flax.core.spmd import logical_axis_rules as axis_rules
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    jax.config.update("jax_default_prng_impl", "unsafe_rbg")  # as train_compile.main does
    config = _config(argv)
    mesh = train_compile.get_topology_mesh(config)
    shaped_args, shaped_kwargs, state_shardings, _, model_graph = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    input_state_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings,
                                                                            params_shardings)
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static_argnums, donate_argnums = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_state_shardings, model_graph, config, params_shardings)
    with jax.set_mesh(mesh), axis_rules(config.logical_axis_rules), _tokamax_cross_compile():
        jitted = jax.jit(func, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static_argnums,
                         donate_argnums=donate_argnums)
        lowered = jitted.trace(*shaped_args, **shaped_kwargs).lower(lowering_platforms=("tpu",))
    devices = int(mesh.devices.size)
    device_ids = [int(d.id) for d in mesh.devices.flat]  # MaxText's ring order, for the compile
    total, weights, attention = maxtext_utils.calculate_tflops_training_per_device(config, log=False)
    tokens = int(config.global_batch_size_to_train_on) * int(config.max_target_length)
    return {
        "lowered": lowered,
        "device_ids": device_ids,
        "tokens": tokens,
        "mesh": [[str(a), int(n)] for a, n in mesh.shape.items() if int(n) > 1] or [["data", 1]],
        "model": {"flops": float(total) * 1e12 * devices,
                  "flops_detail": {"weights": float(weights) * 1e12 * devices,
                                   "attention": float(attention) * 1e12 * devices},
                  "flops_source": "MaxText calculate_tflops_training_per_device",
                  "layers": int(config.num_decoder_layers), "seq": int(config.max_target_length),
                  "maxtext": {"model_name": model, "compile_topology": config.compile_topology,
                              "per_device_batch_size": float(config.per_device_batch_size),
                              "remat_policy": str(config.remat_policy), "attention": str(config.attention),
                              "scan_layers": bool(config.scan_layers),
                              "compile_xla_flags": str(getattr(config, "compile_xla_flags", "") or "")}},
    }
