"""tpudiag.targets: what users type resolves to topologies the real TPU compiler accepts,
errors are one typed line, and the chip figures agree with each other and their sources."""

from __future__ import annotations

import json
import os

import pytest

# libtpu takes a lock file per process; several test processes must be allowed to load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from tpudiag.errors import InputError  # noqa: E402
from tpudiag.targets import (  # noqa: E402
    CHIPS, TARGETS_SCHEMA, Chip, Target, TargetError, _shape_for, resolve_target, targets_table,
)

# text -> (chip, topology, chips, whether a note explains a changed request)
SPELLINGS = {
    "v5e": ("v5e", "v5e:2x2", 4, False),
    "v5e:2x2": ("v5e", "v5e:2x2", 4, False),
    "v5e:2x4": ("v5e", "v5e:2x4", 8, False),
    "v5e:16x16": ("v5e", "v5e:16x16", 256, False),
    "v5e=4x4": ("v5e", "v5e:4x4", 16, False),
    "v5e_4x8": ("v5e", "v5e:4x8", 32, False),
    "v5e 8x8": ("v5e", "v5e:8x8", 64, False),
    "v5e:2x2x1": ("v5e", "v5e:2x2", 4, False),
    "v5e-4": ("v5e", "v5e:2x2", 4, False),
    "v5e-8": ("v5e", "v5e:2x4", 8, False),
    "v5e-128": ("v5e", "v5e:8x16", 128, False),
    "v5litepod-8": ("v5e", "v5e:2x4", 8, False),
    "v5litepod-16": ("v5e", "v5e:4x4", 16, False),
    "v5litepod": ("v5e", "v5e:2x2", 4, False),
    "v5e-1": ("v5e", "v5e:2x2", 4, True),
    "v5litepod-1": ("v5e", "v5e:2x2", 4, True),
    "v5e:1x1": ("v5e", "v5e:2x2", 4, True),
    "V5E": ("v5e", "v5e:2x2", 4, False),
    "tpu v5e": ("v5e", "v5e:2x2", 4, False),
    "TPU_V5E": ("v5e", "v5e:2x2", 4, False),
    "tpu-v5e-8": ("v5e", "v5e:2x4", 8, False),
    "  v5e:2x4  ": ("v5e", "v5e:2x4", 8, False),
    "TPU v5 lite": ("v5e", "v5e:2x2", 4, False),  # jax device_kind of v5e
    "v6e": ("v6e", "v6e:2x2", 4, False),
    "v6e:4x4": ("v6e", "v6e:4x4", 16, False),
    "v6e-4": ("v6e", "v6e:2x2", 4, False),
    "v6e-8": ("v6e", "v6e:2x4", 8, False),
    "v6e-256": ("v6e", "v6e:16x16", 256, False),
    "v6e-1": ("v6e", "v6e:2x2", 4, True),
    "TPU v6 lite": ("v6e", "v6e:2x2", 4, False),
    "Trillium": ("v6e", "v6e:2x2", 4, False),
    "TPU_V6E": ("v6e", "v6e:2x2", 4, False),
    "v5p": ("v5p", "v5p:2x2x1", 4, False),
    "v5p:2x2x1": ("v5p", "v5p:2x2x1", 4, False),
    "v5p:2x2": ("v5p", "v5p:2x2x1", 4, False),
    "v5p:2x4x4": ("v5p", "v5p:2x4x4", 32, False),
    "v5p:16x16x24": ("v5p", "v5p:16x16x24", 6144, False),
    "v5p-8": ("v5p", "v5p:2x2x1", 4, False),  # -N counts TensorCores: 8 cores = 4 chips
    "v5p-16": ("v5p", "v5p:2x2x2", 8, False),
    "v5p-32": ("v5p", "v5p:2x2x4", 16, False),
    "v5p-128": ("v5p", "v5p:4x4x4", 64, False),
    "v5p-2": ("v5p", "v5p:2x2x1", 4, True),
    "v5p:1x1x1": ("v5p", "v5p:2x2x1", 4, True),
    "TPU v5": ("v5p", "v5p:2x2x1", 4, False),  # jax device_kind of v5p
    "TPU v5p": ("v5p", "v5p:2x2x1", 4, False),
    "v4": ("v4", "v4:2x2x1", 4, False),
    "v4:2x2x1": ("v4", "v4:2x2x1", 4, False),
    "v4:2x2x2": ("v4", "v4:2x2x2", 8, False),
    "v4-8": ("v4", "v4:2x2x1", 4, False),
    "v4-16": ("v4", "v4:2x2x2", 8, False),
    "v4-8192": ("v4", "v4:16x16x16", 4096, False),
    "TPU v4": ("v4", "v4:2x2x1", 4, False),
    "v4-2": ("v4", "v4:2x2x1", 4, True),
    # TPU7x counts TensorCores like v5p (MaxText's tpu7x-128 is 64 chips, 4x4x4).
    "tpu7x": ("tpu7x", "tpu7x:2x2x1", 4, False),
    "TPU7x": ("tpu7x", "tpu7x:2x2x1", 4, False),  # jax device_kind
    "ironwood": ("tpu7x", "tpu7x:2x2x1", 4, False),
    "v7x-128": ("tpu7x", "tpu7x:4x4x4", 64, False),
    "tpu7x-512": ("tpu7x", "tpu7x:4x8x8", 256, False),
    "tpu7x:4x4x4": ("tpu7x", "tpu7x:4x4x4", 64, False),
}

BAD = {
    "tpu7": "not a TPU", "tpu7x-3": "multiple of 2",
    "v3": "v3", "v2:2x2": "v2", "TPU v4 lite": "v4i", "gpu": "not a TPU", "cuda": "not a TPU",
    "": "empty", "   ": "empty", "v5": "ambiguous", "foo": "not a TPU", "v5e\nv5p": "not a TPU",
    "v5e-2": "slice size", "v5e-512": "slice size", "v5e-12": "slice size", "v5e-0": "at least 1",
    "v5p-3": "multiple of 2", "v4-6": "slice size", "v5e:1x2": "even", "v4:1x1x2": "even",
    "v5e:32x8": "largest", "v6e:2x256": "largest", "v5p:32x32x32": "largest",
    "v5e:2x2x2": "2 dimensions",
}


@pytest.mark.parametrize("text", sorted(SPELLINGS))
def test_resolve_accepted_spellings(text):
    chip, topology, chips, noted = SPELLINGS[text]
    target = resolve_target(text)
    assert isinstance(target, Target)
    assert (target.chip.name, target.topology, target.chips) == (chip, topology, chips)
    assert target.chip is CHIPS[chip]
    if noted:  # a single chip was asked for: the note names the slice used instead, and why
        assert topology in target.note and "chips_per_host_bounds" in target.note
        # ...and a program is modelled on one chip of it
        assert target.single_chip and target.model_devices == target.chip.devices_per_chip
        assert target.to_dict()["single_chip"] is True
    else:
        assert target.note is None and not target.single_chip and target.model_devices == target.devices
    assert target.megacore().single_chip == target.single_chip
    json.dumps(target.to_dict())


@pytest.mark.parametrize("text", sorted(BAD))
def test_errors_are_one_typed_line_listing_valid_targets(text):
    with pytest.raises(TargetError) as info:
        resolve_target(text)
    msg = str(info.value)
    assert isinstance(info.value, InputError) and info.value.exit_code == 2
    assert "\n" not in msg
    assert BAD[text] in msg
    assert "valid targets: v4, v5e, v5p, v6e" in msg
    for example in ("v5litepod-8", "v6e-4", "v5p-8", "v4-8"):
        assert example in msg


def test_megacore_v4_is_one_device_a_chip_and_round_trips(get_topology):
    t = resolve_target("v4-128").megacore()
    assert (t.topology, t.chips, t.devices, t.chip.devices_per_chip) == ("v4:4x4x4@megacore", 64, 64, 1)
    assert resolve_target(t.topology) == t  # a run's recorded topology resolves to the same target
    assert resolve_target("v5p-8").megacore() == resolve_target("v5p-8")  # already one device a chip
    from tpudiag.targets import topology_desc

    assert len(topology_desc(t.topology).devices) == 64


def test_a_chip_configuration_rides_on_the_target_and_round_trips(get_topology):
    t = resolve_target("v5p-1024@megachip_tccontrol")
    assert (t.topology, t.chips, t.devices, t.chip_config) == ("v5p:8x8x8@megachip_tccontrol", 512, 512,
                                                               "megachip_tccontrol")
    assert resolve_target(t.topology) == t and resolve_target("v5p-1024").chip_config is None
    assert resolve_target("v4-128@megacore") == resolve_target("v4-128").megacore()
    from tpudiag.targets import topology_desc

    assert len(topology_desc("v6e:2x4@megachip").devices) == 8
    with pytest.raises(Exception, match="megachip"):  # libtpu ships no such configuration for v5e
        topology_desc("v5e:2x2@megachip")
    with pytest.raises(TargetError, match="chip configuration name"):
        resolve_target("v5p-8@mega chip")


@pytest.mark.parametrize("text,wrap", [
    ("v5p-128", (True, True, True)), ("v5p-64", (False, False, False)), ("v4-128", (True, True, True)),
    ("tpu7x-128", (True, True, True)), ("v6e-256", (True, True)), ("v6e-128", (False, True)),
    ("v5e-8", (False, False)), ("v5p-1024@megachip_tccontrol", (True, True, True)),
])
def test_wraparound_links_follow_whole_cubes_and_full_pod_axes(text, wrap):
    from tpudiag.targets import topology_dims, wraparound

    t = resolve_target(text)
    assert wraparound(t.chip, topology_dims(t.topology)) == wrap


def test_the_compile_topology_has_the_wraparound_links(get_topology):
    """libtpu takes the links with the slice; a torus and a line are different machines to it (the
    device count is the same, what the compiler builds is not: docs/targets.md#wraparound-links)."""
    from tpudiag.targets import topology_desc

    for topology in ("v5p:4x4x4", "v6e:16x16", "tpu7x:4x4x4", "v4:4x4x4@megacore"):
        assert len(topology_desc(topology).devices) == resolve_target(topology).devices


def test_tpu7x_is_two_devices_a_chip():
    t = resolve_target("tpu7x-128")
    assert (t.chips, t.devices, t.chip.devices_per_chip) == (64, 128, 2)


def test_chip_table_is_self_consistent():
    assert list(CHIPS) == ["v4", "v5e", "v5p", "v6e", "tpu7x"]
    for name, chip in CHIPS.items():
        assert isinstance(chip, Chip) and chip.name == name
        assert chip.ridge_flops_per_byte == chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
        assert chip.default_topology.startswith(name + ":")
        assert resolve_target(name).topology == chip.default_topology
        assert chip.peak_int8_ops_per_s is None or chip.peak_int8_ops_per_s >= chip.peak_bf16_flops_per_s
        assert chip.vmem_bytes < chip.hbm_bytes
        assert chip.ici_bytes_per_s < chip.hbm_bytes_per_s  # ICI is the slower path on every TPU
        assert chip.sources and all(s.startswith("https://") for s in chip.sources)
        # Peak = clock x MXU FLOP/cycle within the rounding of the clock (1%).
        mxu_flops_per_cycle = chip.peak_bf16_flops_per_s / chip.clock_hz
        assert mxu_flops_per_cycle == pytest.approx(
            {"v4": 2 * 4 * 128 * 128 * 2, "v5e": 4 * 128 * 128 * 2,
             "v5p": 2 * 4 * 128 * 128 * 2, "v6e": 4 * 256 * 256 * 2,
             "tpu7x": 2 * 4 * 256 * 256 * 2}[name], rel=0.01)


def test_ridges_match_the_public_figures():
    ridge = {name: chip.ridge_flops_per_byte for name, chip in CHIPS.items()}
    assert ridge["v5e"] == pytest.approx(240, rel=0.02)
    assert ridge["v6e"] == pytest.approx(561, rel=0.02)
    # 459 TF/s / 2765 GB/s (Cloud v5p page). TPU-NOTES.md's 187 uses JAX tpu_info's 2.46e12,
    # which no public page states; the scaling book's 2.8e12 gives 164.
    assert ridge["v5p"] == pytest.approx(166, rel=0.02)
    assert ridge["v4"] == pytest.approx(229, rel=0.02)


def test_figures_agree_with_jax_tpu_info_where_it_is_public():
    # jax/_src/pallas/mosaic/tpu_info.py (jax 0.10.2) records per-TensorCore figures; these
    # are the rows where it and the Cloud pages agree within rounding (2%). v5p HBM bandwidth
    # (2.46e12 there) and v4 int8 (0 there) are the documented exceptions.
    jax_chip = {  # (bf16 FLOP/s, int8 OP/s, HBM bytes/s, HBM bytes, VMEM bytes per core)
        "v4": (2.75e14, None, 1.23e12, 34.4e9, 16 << 20),
        "v5e": (1.97e14, 3.94e14, 8.20e11, 17.2e9, 128 << 20),
        "v5p": (4.59e14, 9.18e14, None, 103e9, 64 << 20),
        "v6e": (9.20e14, 1.84e15, 1.64e12, 34.4e9, 128 << 20),
    }
    for name, (bf16, int8, bw, hbm, vmem) in jax_chip.items():
        chip = CHIPS[name]
        assert chip.peak_bf16_flops_per_s == pytest.approx(bf16, rel=0.02)
        if int8 is not None:
            assert chip.peak_int8_ops_per_s == pytest.approx(int8, rel=0.02)
        if bw is not None:
            assert chip.hbm_bytes_per_s == pytest.approx(bw, rel=0.03)
        assert chip.hbm_bytes == pytest.approx(hbm, rel=0.02)  # v5p: 95 GiB usable vs 96 GiB physical
        assert chip.vmem_bytes == vmem


def test_targets_table_is_json_safe_with_units_in_names():
    rows = targets_table()
    assert TARGETS_SCHEMA == "tpudiag.targets/1"
    assert [r["name"] for r in rows] == list(CHIPS)
    assert json.loads(json.dumps(rows, sort_keys=True)) == rows
    units = ("_per_s", "_bytes", "_hz", "_per_byte", "_links", "_per_chip", "_per_tensorcore", "_chips")
    for row in rows:
        assert row["default_topology"] == CHIPS[row["name"]].default_topology
        assert row["ridge_flops_per_byte"] == CHIPS[row["name"]].ridge_flops_per_byte
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert key.endswith(units), key


def test_slice_shapes_follow_the_cloud_tables():
    twod = [_shape_for(CHIPS["v5e"], 2**k) for k in range(2, 9)]
    assert twod == [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)]
    threed = [_shape_for(CHIPS["v5p"], 2**k) for k in range(2, 13)]
    assert threed == [(2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8), (4, 8, 8),
                      (8, 8, 8), (8, 8, 16), (8, 16, 16), (16, 16, 16)]


# --- The real TPU compiler: every topology we hand out is one it accepts, with that many chips.


@pytest.fixture(scope="module")
def get_topology():
    pytest.importorskip("libtpu")  # the TPU compiler ships in the libtpu wheel (jax[tpu])
    topologies = pytest.importorskip("jax.experimental.topologies")

    def get(name):
        return topologies.get_topology_desc(platform="tpu", topology_name=name)

    return get


def _every_resolvable_target() -> dict[str, Target]:
    out = {text: resolve_target(text) for text in SPELLINGS}
    for chip in CHIPS.values():
        cores = chip.tensorcores_per_chip
        n = 4
        while n <= chip.pod_max_chips:  # every power-of-two slice size, up to the largest slice
            out[f"{chip.name}-{n * cores}"] = resolve_target(f"{chip.name}-{n * cores}")
            n *= 2
    return out


def test_every_resolved_topology_is_accepted_by_the_tpu_compiler(get_topology):
    targets = _every_resolvable_target()
    for chip in CHIPS.values():
        targets[f"default {chip.name}"] = Target(chip, chip.default_topology, resolve_target(chip.name).chips)
    checked = {}
    for text, target in targets.items():
        if target.topology in checked:
            assert checked[target.topology] == (target.chips, target.devices), text
            continue
        devices = get_topology(target.topology).devices
        # Chips are distinct physical coordinates; on v4 each chip shows up as two devices
        # (core_on_chip 0 and 1), on v5p as one megacore device with num_cores 2.
        assert len({tuple(d.coords) for d in devices}) == target.chips, text
        assert len(devices) == target.devices, text
        assert {d.core_on_chip for d in devices} == set(range(target.chip.devices_per_chip)), text
        # The device_kind the compiler reports resolves back to the same chip.
        assert resolve_target(devices[0].device_kind).chip is target.chip, devices[0].device_kind
        checked[target.topology] = (target.chips, target.devices)
    assert len(checked) >= 30


def test_single_chip_topologies_and_the_libtpu_that_refuses_them(get_topology):
    # Why resolve_target maps one chip to the smallest slice (and says so in `note`): libtpu 0.0.42
    # (jax 0.10.2) refuses a single chip. libtpu 0.0.50 (jax 0.12) accepts one; the mapping stays,
    # so that one target means the same compile on every supported jax.
    import importlib.metadata as md

    from packaging.version import Version

    refused = Version(md.version("libtpu")) < Version("0.0.50")
    for name in ("v5e:1x1", "v6e:1x1", "v5p:1x1x1", "v4:1x1x1"):
        if refused:
            with pytest.raises(Exception, match="chips_per_host_bounds"):
                get_topology(name)
        else:
            assert get_topology(name).devices, name
