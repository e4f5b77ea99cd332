"""The TPU chip table (v4, v5e, v5p, v6e, TPU7x) and the parser for the target names users type.

Holds one frozen `Chip` per supported generation with the per-chip figures a roofline needs
(peak bf16 FLOP/s, peak int8 OP/s, HBM size and bandwidth, VMEM, ICI, clock), and
`resolve_target(text)`, which turns what a user types ("v5e", "v5litepod-8", "v5p-8",
"v6e:4x4") into a `Target`: the chip, a topology name that
`jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name=...)` accepts,
and the number of chips in it. `targets_table()` gives JSON-safe rows for `tpudiag targets`.

Where the figures come from: the Cloud TPU system-architecture pages
(cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e) first, then the JAX scaling book
(jax-ml.github.io/scaling-book/tpus), then JAX's own table (jax/_src/pallas/mosaic/tpu_info.py,
rendered at docs.jax.dev/en/latest/pallas/tpu/hardware.html). Every figure below says which.
The clock is not published for any of these chips; it is derived (see `_clock`). Where the
sources disagree the comment says so. Topology facts (what libtpu accepts, how many devices
a topology has) were measured with jax 0.10.2 and libtpu 0.0.42.

What it does not do: it imports no jax (resolution is pure string work, so `tpudiag --help`
stays instant), it does not call the TPU compiler to check a topology (tests/test_targets.py
does), and it measures nothing: every figure is a vendor peak, not an achieved rate.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field, replace

from tpudiag.errors import InputError

# `tpudiag targets --json` wraps `targets_table()` as {"schema": TARGETS_SCHEMA, "targets": rows}.
TARGETS_SCHEMA = "tpudiag.targets/1"

GiB = 1024**3

_CLOUD = "https://cloud.google.com/tpu/docs/"
_SCALING_BOOK = "https://jax-ml.github.io/scaling-book/tpus/"
_JAX_TPU_INFO = "https://docs.jax.dev/en/latest/pallas/tpu/hardware.html"


def _clock(peak_bf16_flops_per_s: float, tensorcores: int, mxus_per_core: int, mxu_dim: int) -> float:
    """Clock implied by the published bf16 peak: peak / (cores x MXUs x dim^2 MACs x 2 FLOP/MAC).

    No Cloud page publishes a TPU clock. Peak = clock x FLOP/cycle is how the peaks are defined,
    and the TPU compiler agrees on FLOP/cycle: its static LLO profile (libtpu 0.0.42) of a
    4096^3 bf16 matmul comes out at 97% (v5e), 94% (v6e) and 97% (v5p) of the FLOP/cycle used
    here, so static cycles / this clock gives seconds on the same scale as peak FLOP/s.
    """
    return peak_bf16_flops_per_s / (tensorcores * mxus_per_core * mxu_dim * mxu_dim * 2)


@dataclass(frozen=True)
class Chip:
    """Figures for one TPU chip. All are per chip except `vmem_bytes` (per TensorCore)."""

    name: str  # "v5e": the name tpudiag prints and that topology names start with
    peak_bf16_flops_per_s: float
    peak_int8_ops_per_s: float | None  # None where the chip has no int8 MXU mode
    hbm_bytes: int
    hbm_bytes_per_s: float
    # VMEM is private to each TensorCore, so this one figure is per core, not per chip: a
    # kernel's blocks must fit in it whatever the chip's core count.
    vmem_bytes: int
    # ICI: total bidirectional bytes/s per chip over all its links, the way the Cloud pages
    # state it ("Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)"). One link
    # in one direction is ici_bytes_per_s / ici_links / 2.
    ici_bytes_per_s: float
    ici_links: int
    tensorcores_per_chip: int
    clock_hz: float  # converts the compiler's static cycle estimates to seconds
    default_topology: str  # what a bare "v5e" resolves to; accepted by get_topology_desc
    # How many jax devices one chip is in a compile-only topology (measured, libtpu 0.0.42):
    # v4 exposes each TensorCore as its own device (core_on_chip 0 and 1, num_cores 1), so a
    # program compiled for one v4 device gets half a chip; v5p exposes one megacore device
    # per chip (num_cores 2); v5e and v6e have one core per chip.
    devices_per_chip: int
    pod_max_chips: int  # the largest single slice the Cloud page lists
    torus_dims: int  # 2 (v5e, v6e) or 3 (v4, v5p): the number of dimensions in a topology name
    # The MXU's rate on e4m3 operands; None where it takes none (v4: Mosaic refuses an fp8 matmul,
    # so fp8 is a storage format there, upcast before the MXU: kernels/fp8_matmul.py's mode_for).
    peak_fp8_flops_per_s: float | None = None
    # The link between a chip and its host (PCIe), bytes/s each way, shared by the chip's devices:
    # what activation offload to host memory moves over. None where no public page gives it.
    host_link_bytes_per_s: float | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where bf16 compute time equals HBM time (the roofline ridge)."""
        return self.peak_bf16_flops_per_s / self.hbm_bytes_per_s

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "default_topology": self.default_topology,
            "peak_bf16_flops_per_s": self.peak_bf16_flops_per_s,
            "peak_int8_ops_per_s": self.peak_int8_ops_per_s,
            "peak_fp8_flops_per_s": self.peak_fp8_flops_per_s,
            "host_link_bytes_per_s": self.host_link_bytes_per_s,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "vmem_bytes_per_tensorcore": self.vmem_bytes,
            "ici_bytes_per_s": self.ici_bytes_per_s,
            "ici_links": self.ici_links,
            "tensorcores_per_chip": self.tensorcores_per_chip,
            "clock_hz": self.clock_hz,
            "devices_per_chip": self.devices_per_chip,
            "pod_max_chips": self.pod_max_chips,
            "ridge_flops_per_byte": self.ridge_flops_per_byte,
            "sources": list(self.sources),
        }


CHIPS: dict[str, Chip] = {
    "v4": Chip(
        name="v4",
        # cloud.google.com/tpu/docs/v4: "Peak compute per chip 275 teraflops (bf16 or int8)".
        peak_bf16_flops_per_s=275e12,
        # Same row: "(bf16 or int8)"; the scaling book table agrees (2.75e14 int8). JAX's
        # tpu_info.py records 0 ("Not Available") for v4 int8: v4 has no 2x int8 rate.
        peak_int8_ops_per_s=275e12,
        # cloud.google.com/tpu/docs/v4: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps".
        hbm_bytes=32 * GiB,
        hbm_bytes_per_s=1200e9,
        # Not on a Cloud page; JAX tpu_info.py (docs.jax.dev .../pallas/tpu/hardware.html):
        # "vmem_capacity_bytes=16 * 1024 * 1024  # 16 MiB per core".
        vmem_bytes=16 * 1024 * 1024,
        # Not on the Cloud v4 page. Scaling book: "ICI BW/link (bidi) 9e10" for TPU v4p, and
        # v4 "connected to the nearest 6 neighbors" (3D torus): 6 x 9e10 = 5.4e11 per chip.
        ici_bytes_per_s=6 * 90e9,
        ici_links=6,
        # cloud.google.com/tpu/docs/v4: "Each TPU v4 chip contains two TensorCores".
        tensorcores_per_chip=2,
        # Not published on a Cloud page; derived, 2 cores x 4 MXUs ("Each TensorCore has four
        # MXUs", Cloud v4 page) x 128x128 -> 1.049 GHz. The TPU v4 paper (ISCA 2023,
        # arXiv 2304.01433) gives 1050 MHz; not re-checked here. Rounded to 1.05 GHz.
        clock_hz=round(_clock(275e12, 2, 4, 128), -7),
        default_topology="v4:2x2x1",  # 4 chips, 8 TensorCores: the v4-8 slice
        devices_per_chip=2,
        pod_max_chips=4096,  # Cloud v4 page: "TPU Pod size 4096 chips"
        torus_dims=3,
        # Scaling book ("How to think about TPUs"): "PCIe bandwidth for TPU v4 is 16GB / second each way".
        host_link_bytes_per_s=16e9,
        sources=(_CLOUD + "v4", _SCALING_BOOK, _JAX_TPU_INFO),
    ),
    "v5e": Chip(
        name="v5e",
        # cloud.google.com/tpu/docs/v5e: "Peak compute per chip (bf16) 197 TFLOPs".
        peak_bf16_flops_per_s=197e12,
        # Same page: "Peak compute per chip (Int8) 393 TOPs". JAX tpu_info.py and the scaling
        # book say 3.94e14 (2 x 197); the 0.25% difference is rounding on Google's side.
        peak_int8_ops_per_s=393e12,
        # Cloud page: "HBM2 capacity and bandwidth 16 GB, 819 GBps"; the scaling book links
        # the same page as "TPU v5e has 16GiB of HBM", and tpu_info.py's 17.2e9 is 16 GiB.
        hbm_bytes=16 * GiB,
        # 819 GBps from the row above. A newer revision of the page lists "800 GiBps"
        # (859 GB/s) and the scaling book 8.1e11; JAX tpu_info.py 8.20e11. Kept 819e9.
        hbm_bytes_per_s=819e9,
        # Scaling book: "VMEM ... (for example, 128 MiB on TPU v5e)"; tpu_info.py agrees.
        vmem_bytes=128 * 1024 * 1024,
        # Cloud page: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)
        # 400 GBps", "ICI ports per chip 4" (scaling book: 1e11 bidi per link x 4 links).
        ici_bytes_per_s=400e9,
        ici_links=4,
        # Cloud page: "Each v5e chip contains one TensorCore. Each TensorCore has four MXUs".
        tensorcores_per_chip=1,
        # Not published; derived, 1 core x 4 MXUs x 128x128 -> 1.503 GHz. The scaling book
        # says "5e13 bf16 FLOPs/s per MXU at 1.5GHz on TPU v5e". Rounded to 1.5 GHz.
        clock_hz=round(_clock(197e12, 1, 4, 128), -8),
        default_topology="v5e:2x2",  # v5e:1x1 is refused: "not divisible by chips_per_host_bounds 2x2x1"
        devices_per_chip=1,
        pod_max_chips=256,  # Cloud page: "TPU Pod size 256 chips", largest slice 16x16
        torus_dims=2,
        # No Cloud figure. Measured: libtpu (0.0.50) compiles an e4m3 x e4m3 Mosaic matmul for v5e,
        # and its static profile of a compute-bound one (fp8_matmul, M8192 K4096 N14336 in M blocks
        # of 512, 962 GFLOP, x quantized in the kernel) takes 7.33M cycles, what the bf16 peak needs
        # (1.00x): the bf16 rate. (With M blocks of 256, which read the weights twice as often, M2048
        # took 1.21x, once taken here for a slower rate.)
        peak_fp8_flops_per_s=197e12,
        # Scaling book: "PCIe bandwidth is typically around 1.5e10 bytes / second per chip" (v6e "about 2x
        # higher than v5"); read as each way, as its v4 figure is stated.
        host_link_bytes_per_s=1.5e10,
        sources=(_CLOUD + "v5e", _SCALING_BOOK, _JAX_TPU_INFO),
    ),
    "v5p": Chip(
        name="v5p",
        # cloud.google.com/tpu/docs/v5p: "Peak compute per chip (BF16) (TFLOPs) 459".
        peak_bf16_flops_per_s=459e12,
        # Not on the Cloud v5p page (it lists FP8 459). Scaling book table: "TPU v5p ...
        # FLOPs/s/chip (int8) 9.18e14"; JAX tpu_info.py agrees (9.18e14).
        peak_int8_ops_per_s=918e12,
        # Cloud page: "HBM capacity per chip (GiB) 95", noting 96 GiB physical of which the
        # runtime reserves some; 95 GiB is what a program can allocate.
        hbm_bytes=95 * GiB,
        # Cloud page: "HBM bandwidth per chip (GBps) 2765" (another revision: "2575 GiBps",
        # the same rate); scaling book 2.8e12. JAX tpu_info.py and TPU-NOTES.md say 2.46e12,
        # which no public page states: the public figure is kept, so the ridge is 166, not 187.
        hbm_bytes_per_s=2765e9,
        # Not on a Cloud page; JAX tpu_info.py: "64 MiB per core".
        vmem_bytes=64 * 1024 * 1024,
        # Cloud page: "Bidirectional inter-chip interconnect (ICI) bandwidth per chip (GBps)
        # 1200"; 3D torus, 6 neighbours (scaling book: 2e11 bidi per link x 6 = 1.2e12).
        ici_bytes_per_s=1200e9,
        ici_links=6,
        # Cloud page: "Number of TensorCores per chip 2" ("Each TensorCore has four MXUs").
        tensorcores_per_chip=2,
        # Not published; derived, 2 cores x 4 MXUs x 128x128 -> 1.751 GHz. Rounded to 1.75 GHz.
        clock_hz=round(_clock(459e12, 2, 4, 128), -7),
        default_topology="v5p:2x2x1",  # 4 chips, 8 TensorCores: the v5p-8 slice
        devices_per_chip=1,
        pod_max_chips=6144,  # Cloud page: "The maximum v5p shape is 16x16x24 (6144 chips)"
        torus_dims=3,
        # The Cloud v5p page lists "FP8 459" TFLOPs: the bf16 rate.
        peak_fp8_flops_per_s=459e12,
        # Scaling book: "typically around 1.5e10 bytes / second per chip" (as v5e).
        host_link_bytes_per_s=1.5e10,
        sources=(_CLOUD + "v5p", _SCALING_BOOK, _JAX_TPU_INFO),
    ),
    "v6e": Chip(
        name="v6e",
        # cloud.google.com/tpu/docs/v6e: "Peak compute per chip (bf16) 918 TFLOPs"
        # (JAX tpu_info.py and the scaling book: 9.20e14).
        peak_bf16_flops_per_s=918e12,
        # Same page: "Peak compute per chip (Int8) 1836 TOPs".
        peak_int8_ops_per_s=1836e12,
        # Same page: "HBM capacity per chip 32 GB"; tpu_info.py's 34.4e9 is 32 GiB.
        hbm_bytes=32 * GiB,
        # Same page (current revision): "HBM bandwidth per chip 1638 GBps". Older revisions:
        # 1640 and 1600 GBps; tpu_info.py 1.64e12; scaling book 1.6e12.
        hbm_bytes_per_s=1638e9,
        # Not on a Cloud page; JAX tpu_info.py: "128 MiB per core".
        vmem_bytes=128 * 1024 * 1024,
        # Same page: "Bidirectional inter-chip interconnect (ICI) bandwidth (per chip)
        # 800 GBps", "ICI ports per chip 4" (scaling book: 2e11 bidi per link x 4).
        ici_bytes_per_s=800e9,
        ici_links=4,
        # Same page: "Each v6e chip contains one TensorCore".
        tensorcores_per_chip=1,
        # Not published; derived. The Cloud page says "two 256x256 MXUs" (one revision says 4),
        # which would need 3.5 GHz; the compiler's static profile of a 4096^3 bf16 matmul
        # (278,953 cycles) implies 4 x 256x256 MXU-equivalents per cycle, so:
        # 1 core x 4 x 256x256 -> 1.751 GHz. Rounded to 1.75 GHz.
        clock_hz=round(_clock(918e12, 1, 4, 256), -7),
        default_topology="v6e:2x2",  # v6e:1x1 is refused like v5e:1x1
        devices_per_chip=1,
        pod_max_chips=256,  # Cloud page: "TPU Pod size 256 chips", largest slice 16x16
        torus_dims=2,
        # No Cloud figure; libtpu (0.0.50) compiles an e4m3 x e4m3 Mosaic matmul for v6e, but its
        # static profile aborts on it (an LLO check), so the rate is not measured: taken at the bf16
        # rate, as the Cloud page gives v5p.
        peak_fp8_flops_per_s=918e12,
        # Scaling book: "Trillium (TPU v6e) has 32GB/s, about 2x higher than v5" (the Cloud page: PCIe
        # Gen5, no rate).
        host_link_bytes_per_s=32e9,
        sources=(_CLOUD + "v6e", _SCALING_BOOK, _JAX_TPU_INFO),
    ),
    "tpu7x": Chip(
        name="tpu7x",  # libtpu's topology names: tpu7x:4x4x4
        # cloud.google.com/tpu/docs/tpu7x: "Peak compute per chip (BF16) (TFLOPs) 2307".
        peak_bf16_flops_per_s=2307e12,
        # The same table lists FP8 4614; JAX's tpu_info.py: "int8_ops_per_second=0, # Not Available".
        peak_int8_ops_per_s=None,
        # Same table: "HBM capacity per chip (GiB) 192", "HBM bandwidth per chip (GB/s) 7380".
        hbm_bytes=192 * GiB,
        hbm_bytes_per_s=7380e9,
        # Not on the Cloud page; JAX tpu_info.py (TPU_7X): "64 MiB per core".
        vmem_bytes=64 * 1024 * 1024,
        # Same table: "Bi-directional inter-chip interconnect (ICI) bandwidth per chip (GB/s) 1200";
        # 3D torus like v5p (the page: "shares many similarities with TPU v5p"), 6 neighbours.
        ici_bytes_per_s=1200e9,
        ici_links=6,
        # Same table: "Number of TensorCores per chip 2". The page: "the Ironwood programming model
        # lets you access two TPU devices" (no megacore): libtpu 0.0.50's tpu7x:4x4x4 has 128 devices.
        tensorcores_per_chip=2,
        # Not published; derived as for v6e, 2 cores x 4 x 256x256 MXU-equivalents -> 2.2 GHz. libtpu
        # 0.0.50's static profile of a 4096^3 bf16 matmul on one device, its loops stepped through, takes
        # 280,908 cycles: 93% of the peak at 2.2 GHz (v5e/v5p/v6e: 94-97%). Fast-forwarded loops read
        # 868,698 (30%), as they inflate v6e's (654,563 against 279,025). JAX's tpu_info.py says 2 MXUs
        # of 256 columns per core, which would need 4.4 GHz.
        clock_hz=round(_clock(2307e12, 2, 4, 256), -7),
        default_topology="tpu7x:2x2x1",  # 4 chips, 8 devices (libtpu 0.0.50)
        devices_per_chip=2,
        pod_max_chips=9216,  # Cloud page: "Number of chips per pod 9216"
        torus_dims=3,
        # Same table: "Peak compute per chip (FP8) (TFLOPs) 4614": twice the bf16 rate.
        peak_fp8_flops_per_s=4614e12,
        sources=(_CLOUD + "tpu7x", _JAX_TPU_INFO),
    ),
}


MEGACORE_SUFFIX = "@megacore"


# Full-pod axis length of v5e and v6e slices: only a 16-chip axis has its wraparound link.
EPOD_AXIS = 16


def wraparound(chip: Chip, dims: tuple[int, ...]) -> tuple[bool, ...]:
    """Which axes of a slice have wraparound links (a torus ring, not a line): v4, v5p and TPU7x
    slices made of whole 4x4x4 cubes on every axis; v5e and v6e only on a full-pod (16-chip) axis.
    The rule is the one MaxText's ahead-of-time compiles give libtpu (`accelerator_to_spec_map`'s
    `wrap`). It changes what the TPU compiler builds: DeepSeek V3's published step on v5p-1024
    needs 95.89 GB of temporaries on an 8x8x8 line and fits on the 8x8x8 torus it runs on."""
    if chip.torus_dims == 3:
        cube = all(d % 4 == 0 for d in dims)
        return tuple(cube for _ in dims)
    return tuple(d == EPOD_AXIS for d in dims)


def topology_dims(topology: str) -> tuple[int, ...] | None:
    """(8, 8, 8) for "v5p:8x8x8" or "v5p:8x8x8@megacore"; None without a shape."""
    m = re.search(r":(\d+(?:x\d+)*)$", topology.partition("@")[0])
    return tuple(int(x) for x in m.group(1).split("x")) if m else None


def topology_desc(topology: str):
    """jax's compile-only topology for a `Target.topology`, with the slice's wraparound links
    (`wraparound`): `NAME@CONFIG` compiles with libtpu's chip configuration CONFIG (`megacore`:
    two cores a chip as one device). Imports jax: for the compile and lowering workers."""
    from jax.experimental import topologies

    name, sep, config = topology.partition("@")
    options = {"chip_config_name": config} if sep else {}
    dims, chip = topology_dims(name), CHIPS.get(name.split(":")[0])
    if dims and chip and any(wraparound(chip, dims)):
        wrap = wraparound(chip, dims)
        options.update(chips_per_host_bounds=(2, 2, 1), wrap=tuple(wrap) + (False,) * (3 - len(wrap)))
    with _libtpu_start_quiet():
        return topologies.get_topology_desc(platform="tpu", topology_name=name, **options)


@contextlib.contextmanager
def _libtpu_start_quiet():
    """libtpu prints start-up warnings to file descriptor 2 when it loads on a machine that is no TPU
    VM ("Failed to find host bounds", TPU_WORKER_HOSTNAMES); they mean nothing for a compile-only
    client. Descriptor 2 goes to a scratch file meanwhile, and comes back whole if the call fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            scratch.seek(0)
            sys.stderr.buffer.write(scratch.read())
            sys.stderr.flush()
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@dataclass(frozen=True)
class Target:
    """A chip and a topology the TPU compiler accepts, resolved from what the user typed."""

    chip: Chip
    topology: str  # e.g. "v5e:2x4", or "v5p:8x8x8@megachip_tccontrol"; jax's topology via topology_desc()
    chips: int  # chips in `topology`
    note: str | None = None  # set when the request was changed (a single chip -> smallest slice)
    # One chip asked for: `topology` is the smallest slice the compiler takes, and a program is
    # modelled on one chip of it (a one-chip mesh: no collectives).
    single_chip: bool = False

    @property
    def devices(self) -> int:
        """len(get_topology_desc(...).devices): chips, or TensorCores on v4 (see Chip.devices_per_chip)."""
        return self.chips * self.chip.devices_per_chip

    @property
    def model_devices(self) -> int:
        """The devices a program's mesh spans: one chip's for a single-chip target, else the slice's."""
        return self.chip.devices_per_chip if self.single_chip else self.devices

    def to_dict(self) -> dict:
        doc = {"chip": self.chip.name, "topology": self.topology, "chips": self.chips,
               "devices": self.devices, "note": self.note}
        if self.single_chip:
            doc["single_chip"] = True
        return doc

    @property
    def chip_config(self) -> str | None:
        """The libtpu chip configuration the target compiles with (`NAME@CONFIG`), None for the default."""
        return self.topology.partition("@")[2] or None

    def with_chip_config(self, config: str) -> Target:
        """The same slice compiled with libtpu's chip configuration `config` (a published run's
        `chip_config_name`, e.g. v5p's `megachip_tccontrol`); libtpu refuses a name it does not ship
        when the target is compiled for."""
        return Target(self.chip, f"{self.topology.partition('@')[0]}@{config}", self.chips, self.note, self.single_chip)

    def megacore(self) -> Target:
        """The same slice with each chip's two TensorCores as one device (`chip_config_name
        "megacore"`, as MaxText compiles for v4): one device a chip, with the whole chip's peak,
        bandwidth and HBM. The topology becomes `NAME@megacore` (`topology_desc` reads it). A chip
        that already has one device a chip is returned as it is."""
        if self.chip.devices_per_chip == 1:
            return self
        chip = replace(self.chip, devices_per_chip=1)
        return Target(chip, f"{self.topology.partition('@')[0]}{MEGACORE_SUFFIX}", self.chips, self.note, self.single_chip)


class TargetError(InputError):
    """The target text names no supported TPU (or an impossible slice of one)."""


_VALID = ("valid targets: v4, v5e, v5p, v6e, tpu7x, optionally with a topology (v5e:2x4, v5p:2x2x1) "
          "or a slice size (v5e-8, v5litepod-8, v6e-4, v5p-8, v4-8)")

# Names that mean a supported chip. Keys are lower-case with spaces, '_' and '-' removed.
_ALIASES = {
    "v4": "v4", "tpuv4": "v4",
    "v5e": "v5e", "v5lite": "v5e", "v5litepod": "v5e", "tpuv5e": "v5e", "tpuv5lite": "v5e",
    "v5p": "v5p", "tpuv5p": "v5p", "tpuv5": "v5p",  # "TPU v5" is v5p's jax device_kind
    "v6e": "v6e", "v6lite": "v6e", "tpuv6e": "v6e", "tpuv6lite": "v6e", "trillium": "v6e",
    "tpu7x": "tpu7x", "v7x": "tpu7x", "7x": "tpu7x", "tpuv7x": "tpu7x", "ironwood": "tpu7x",
}

# Names that mean a TPU tpudiag does not support, with the reason.
_UNSUPPORTED = {
    "v2": "TPU v2 is not supported (no chip table for it)",
    "tpuv2": "TPU v2 is not supported (no chip table for it)",
    "v3": "TPU v3 is not supported (no chip table for it)",
    "tpuv3": "TPU v3 is not supported (no chip table for it)",
    "v4i": "TPU v4i (v4 lite) is not supported (no chip table for it)",
    "v4lite": "TPU v4i (v4 lite) is not supported (no chip table for it)",
    "tpuv4lite": "TPU v4i (v4 lite) is not supported (no chip table for it)",
    "v5": "'v5' is ambiguous: say v5e (v5litepod) or v5p",
    "v6": "'v6' is ambiguous: say v6e",
}
for _n in ("gpu", "cpu", "cuda", "rocm", "nvidia", "h100", "a100", "b200", "h200"):
    _UNSUPPORTED[_n] = f"'{_n}' is not a TPU; tpudiag's static targets are TPUs only"

# name, then optionally ':'/'='/'_'/' ' + a shape like 2x4 or 2x2x1, or '-' + a slice size.
_SPEC = re.compile(r"^(?P<name>.*?)(?:[:=_ ](?P<shape>\d+(?:x\d+){1,2})|-(?P<count>\d+))?$", re.S)


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def _fail(text: str, reason: str) -> TargetError:
    # repr() keeps the message on one line whatever the user typed.
    return TargetError(f"target {text!r}: {reason}; {_VALID}")


def _shape_for(chip: Chip, n_chips: int) -> tuple[int, ...]:
    """The slice shape the Cloud pages list for n_chips (a power of two, >= 4).

    2D (v5e, v6e): 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16. 3D (v4, v5p): 2x2x1, 2x2x2, 2x2x4,
    2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, ... (the v5p page's table of common shapes).
    """
    k = n_chips.bit_length() - 1
    if chip.torus_dims == 2:
        return (2 ** (k // 2), 2 ** (k - k // 2))
    if n_chips == 4:
        return (2, 2, 1)
    return tuple(sorted(2 ** ((k + i) // 3) for i in range(3)))


def _smallest(chip: Chip) -> tuple[str, int]:
    shape = _shape_for(chip, 4)
    return f"{chip.name}:{'x'.join(map(str, shape))}", 4


def _single_chip_note(chip: Chip, topology: str) -> str:
    # libtpu 0.0.42 (jax 0.10.2) refuses a one-chip topology; 0.0.50 (jax 0.12) takes it. The same
    # slice is used with both, so one target compiles the same way on every supported jax.
    return (f"a single {chip.name} chip is not a topology every supported TPU compiler accepts "
            f"(chips_per_host_bounds 2x2x1); using {topology} (4 chips), with a program's mesh on one of "
            f"its chips (no collectives)")


def resolve_target(text: str) -> Target:
    """Parse a target as users type it: "v5e", "v5e:2x4", "v5litepod-8", "v5p-8", "TPU_V6E" ...

    `TARGET@CONFIG` compiles with libtpu's chip configuration CONFIG (`@megacore`, or a published
    run's `chip_config_name` such as v5p's `megachip_tccontrol`). A bare name gets the chip's
    default topology. "-N" counts chips on v5e/v6e (v5litepod-8,
    v6e-4) and TensorCores on v4/v5p (v5p-8 and v4-8 are 4 chips), as Cloud accelerator types
    do. A single chip (v5e-1, v6e:1x1, v5p-2) maps to the smallest slice, with a `note`.
    Raises TargetError (one line, listing the valid targets) for anything else.
    """
    raw = text if isinstance(text, str) else ""
    base, at, config = raw.strip().partition("@")
    if at:  # TARGET@CONFIG: libtpu's chip configuration (Target.with_chip_config, Target.megacore)
        config = config.strip().lower()
        if config == MEGACORE_SUFFIX[1:]:
            return resolve_target(base).megacore()
        if not re.fullmatch(r"[a-z0-9_]+", config):
            raise _fail(raw, "after '@' comes a libtpu chip configuration name, such as megachip_tccontrol")
        return resolve_target(base).with_chip_config(config)
    s = raw.strip().lower()
    if not s:
        raise _fail(raw, "empty target")
    m = _SPEC.match(s)
    name, shape_txt, count_txt = m.group("name"), m.group("shape"), m.group("count")
    key = _key(name)
    if key.startswith("tpu") and key not in _ALIASES and key not in _UNSUPPORTED:
        key = key[3:]
    if key in _UNSUPPORTED:
        raise _fail(raw, _UNSUPPORTED[key])
    if key not in _ALIASES:
        raise _fail(raw, "not a TPU tpudiag knows")
    chip = CHIPS[_ALIASES[key]]

    if shape_txt is None and count_txt is None:
        return Target(chip, chip.default_topology, _chips_in(chip.default_topology))

    if count_txt is not None:
        count = int(count_txt)
        per_count = chip.tensorcores_per_chip  # v4/v5p accelerator types count TensorCores
        if count < 1:
            raise _fail(raw, "a slice size must be at least 1")
        if count % per_count:
            raise _fail(raw, f"{chip.name}-N counts TensorCores ({per_count} per chip), so N must "
                             f"be a multiple of {per_count}")
        n_chips = count // per_count
        if n_chips == 1:
            topology, n = _smallest(chip)
            return Target(chip, topology, n, _single_chip_note(chip, topology), single_chip=True)
        if n_chips < 4 or n_chips & (n_chips - 1) or n_chips > chip.pod_max_chips:
            raise _fail(raw, f"{n_chips} chips is not a {chip.name} slice size (1, or a power of two "
                             f"from 4 to {chip.pod_max_chips}); give a topology such as "
                             f"{chip.default_topology} instead")
        shape = _shape_for(chip, n_chips)
        return Target(chip, f"{chip.name}:{'x'.join(map(str, shape))}", n_chips)

    dims = [int(d) for d in shape_txt.split("x")]
    # libtpu takes v5e:2x2x1 and v5p:2x2 too; normalise to the chip's own number of dimensions.
    if chip.torus_dims == 2 and len(dims) == 3 and dims[2] == 1:
        dims = dims[:2]
    elif chip.torus_dims == 3 and len(dims) == 2:
        dims = [*dims, 1]
    if len(dims) != chip.torus_dims or 0 in dims:
        raise _fail(raw, f"{chip.name} topologies have {chip.torus_dims} dimensions "
                         f"(e.g. {chip.default_topology})")
    n_chips = 1
    for d in dims:
        n_chips *= d
    if n_chips == 1:
        topology, n = _smallest(chip)
        return Target(chip, topology, n, _single_chip_note(chip, topology), single_chip=True)
    # libtpu 0.0.42 refuses shapes not divisible by chips_per_host_bounds 2x2x1 (v5e:1x2, v4:1x1x1).
    if dims[0] % 2 or dims[1] % 2:
        raise _fail(raw, f"the TPU compiler needs the first two dimensions even "
                         f"(chips_per_host_bounds 2x2x1), e.g. {chip.default_topology}")
    # 2D pods are one fixed 16x16 torus (Cloud v5e/v6e pages: largest slice 16x16).
    if n_chips > chip.pod_max_chips or (chip.torus_dims == 2 and max(dims) > 16):
        raise _fail(raw, f"larger than the largest {chip.name} slice ({chip.pod_max_chips} chips)")
    return Target(chip, f"{chip.name}:{'x'.join(map(str, dims))}", n_chips)


def _chips_in(topology: str) -> int:
    n = 1
    for d in topology.split(":", 1)[1].split("x"):
        n *= int(d)
    return n


def targets_table() -> list[dict]:
    """One JSON-safe row per supported chip, in CHIPS order, for `tpudiag targets`."""
    return [chip.to_dict() for chip in CHIPS.values()]


LIBTPU_INSTALL = "pip install 'jax[tpu]==0.10.2'"


def require_libtpu() -> None:
    """Compiling for a TPU needs libtpu (its compile-only client), even with no TPU attached."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise TargetError(f"libtpu is not installed, and compiling for a TPU needs it: {LIBTPU_INSTALL} "
                          "(the version jax 0.10.2 matches; a newer libtpu crashes this jax's profiler)")
