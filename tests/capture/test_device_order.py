"""A step's own device order reaches the compile: the estimate worker records a mesh whose devices
are not in the topology's order (MaxText lays its ring along the torus) as `tpudiag.device_ids`, and
the compile worker assigns partition i to device device_ids[i], as `lowered.compile()` does."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
pytest.importorskip("libtpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from tpudiag.capture.estimate_worker import DEVICE_IDS_ATTR, _with_device_order  # noqa: E402
from tpudiag.capture.tpu_worker import compile_one  # noqa: E402
from tpudiag.targets import topology_desc  # noqa: E402


def _lowered(devices):
    mesh = Mesh(np.array(devices), ("x",))
    shard = NamedSharding(mesh, P("x"))
    f = jax.jit(lambda a: jnp.roll(a, 1, axis=0) * 2, in_shardings=shard, out_shardings=shard)
    return f.trace(jax.ShapeDtypeStruct((8, 128), jnp.float32)).lower(lowering_platforms=("tpu",))


@pytest.mark.parametrize("order", ["reversed", "topology"])
def test_the_mesh_order_is_the_compile_order(tmp_path, order):
    topo = list(topology_desc("v5e:2x2").devices)
    devices = topo[::-1] if order == "reversed" else topo
    text = _with_device_order(_lowered(devices), [d.id for d in devices])
    assert (DEVICE_IDS_ATTR in text) == (order == "reversed")
    path = tmp_path / "step.mlir"
    path.write_text(text)
    result = compile_one({"input": str(path), "kind": "mlir", "topology": "v5e:2x2", "out_dir": str(tmp_path)})
    assert result["status"] == "ok"
    assert result["device_coords"] == [list(d.coords) for d in devices]
    json.dumps(result)
