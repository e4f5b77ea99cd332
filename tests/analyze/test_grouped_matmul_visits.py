"""Row-tile visits of megablox-style grouped matmuls: read from the kernel's group-metadata shapes in
a real compile (JAX's megablox `gmm` for v6e, both artifact sets), and the balanced-routing model
against megablox's own `make_group_metadata` on random routings."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ARTIFACT_SETS
from tpudiag.analyze.compile.grouped_matmul import expected_visits, groups_with_rows, tile_visits
from tpudiag.parse.hlo import read_hlo_file


@pytest.mark.parametrize("leg", sorted(ARTIFACT_SETS))
def test_the_gmm_call_of_a_real_compile_is_read_from_its_metadata(leg):
    (path,) = sorted((ARTIFACT_SETS[leg] / "tpu_v6e_megablox" / "hlo").glob("*after_optimizations.txt"))
    module = read_hlo_file(path)
    found = {i.name: tile_visits(module, i) for i in module.instructions()}
    found = {name: tv for name, tv in found.items() if tv is not None}
    # fixtures/programs/tpu_megablox.py: 8192 rows over 8 experts in row tiles of 1024; the other
    # custom calls (AssumeGatherIndicesInBound, ...) and every other op are not grouped matmuls
    assert list(found) == ["gmm.1"]
    tv = found["gmm.1"]
    assert (tv.groups, tv.rows, tv.row_tiles, tv.tile_rows, tv.most) == (8, 8192, 8, 1024, 15)
    # 8 groups of about 1024 rows: each of the 7 boundaries lands inside a tile, which is multiplied twice
    assert tv.expected == pytest.approx(15.0) and tv.factor == pytest.approx(15 / 8)


@pytest.mark.parametrize("groups,rows,tm", [(8, 8192, 1024), (256, 4096, 512), (64, 128, 128), (16, 64, 64),
                                           (256, 128, 128)])
@pytest.mark.parametrize("empty_visited", [False, True])
def test_balanced_routing_matches_megablox_own_metadata(groups, rows, tm, empty_visited):
    """The model's visits that multiply against megablox's own schedule (its `make_group_metadata`,
    the kernel's grid) for routings drawn evenly at random, the mean of 20, within 3% (boundaries
    that land on a tile edge by chance are the difference): gmm's grid (`visit_empty_groups=False`)
    is all such visits; tgmm's (True) also visits each empty group and multiplies nothing there."""
    jnp = pytest.importorskip("jax.numpy")
    from jax.experimental.pallas.ops.tpu.megablox.gmm import make_group_metadata

    rng = np.random.default_rng(groups * rows + tm)
    multiplying, runs = [], []
    for _ in range(20):
        sizes = np.bincount(rng.integers(0, groups, rows), minlength=groups).astype(np.int32)
        (_, ids, _), tiles = make_group_metadata(group_sizes=jnp.asarray(sizes), m=rows, tm=tm,
                                                 start_group=jnp.int32(0), num_nonzero_groups=groups,
                                                 visit_empty_groups=empty_visited)
        visited = np.asarray(ids)[:int(tiles)]
        if not empty_visited:
            assert np.all(sizes[visited] > 0)  # gmm's grid visits only groups with rows
        multiplying.append(int(np.count_nonzero(sizes[visited] > 0)))
        runs.append(1 + int(np.count_nonzero(visited[1:] != visited[:-1])))  # runs of one group's visits
    model = expected_visits(groups, rows, -(-rows // tm))
    assert model == pytest.approx(np.mean(multiplying), rel=0.03)
    assert model <= -(-rows // tm) + groups - 1  # never above the metadata's size
    if not empty_visited:  # gmm reads a group's weight tile once per run (K in one tile)
        assert groups_with_rows(groups, rows) == pytest.approx(np.mean(runs), rel=0.03)


MAXTEXT_RUN = ARTIFACT_SETS["jax-0.12"] / "estimate_maxtext_moe_megablox"
MAXTEXT_STEP = MAXTEXT_RUN / "modules" / "00-step" / "optimized.hlo.txt"


def test_maxtexts_own_kernels_carry_their_tiles_and_gmm_is_priced_by_its_pipeline():
    """MaxText's MoE step with megablox (maxtext 0.2.5, lowered for v5e by the regenerate script):
    4096 rows a device (2 x 1024 tokens, top 2) over 8 experts of 512 x 512. Its gmm and tgmm calls
    record tiles 512 x 1024 x 1024 (base.yml's), which cover K 512 whole: a gmm reads x once, each
    expert's weights once and writes its result once, against the kernel's own estimate, which reads
    an expert's weights at every one of the 15 visits."""
    from tpudiag.analyze.hlo.cost import op_cost

    module = read_hlo_file(MAXTEXT_STEP)
    found = [(i, tv) for i in module.instructions() if (tv := tile_visits(module, i)) is not None]
    kinds = sorted(tv.kind for _, tv in found)
    # forward, the full remat's recompute, and the input gradient for wi_0, wi_1 and wo; tgmm for each weight
    assert kinds == ["gmm"] * 9 + ["tgmm"] * 3
    mb = 2**20
    for instr, tv in found:
        assert (tv.tiles, tv.groups, tv.rows, tv.row_tiles, tv.tile_rows) == ((512, 1024, 1024), 8, 4096, 8, 512)
        assert tv.expected == pytest.approx(15.0) and tv.runs == pytest.approx(8.0)
        declared = op_cost(module, instr).bytes_accessed
        if tv.kind == "gmm":
            # x 4 MiB + 8 experts' 512 x 512 bf16 weights + the result 4 MiB
            assert tv.bytes_moved == 4 * mb + 8 * 512 * 512 * 2 + 4 * mb
            assert declared == 4 * mb + 15 * 512 * 512 * 2 + 4 * mb  # MaxText's: a weight per visit
            # at this size XLA keeps x, the weights and the result in VMEM: none of it is HBM traffic
            assert tv.hbm_bytes == 0
        else:
            assert tv.bytes_moved is None and tv.hbm_bytes is None  # tgmm's own estimate reads each tile once


def test_the_estimate_times_maxtexts_grouped_matmuls_over_their_visits():
    """The estimate's pass over the same step's compile report (rebuilt from the fixture, the passes
    before it applied as the estimate applies them): each gmm and tgmm takes its FLOPs x 15/8 at the
    MXU peak, each gmm its pipeline's bytes (none of them in HBM here), and the finding says so."""
    from tpudiag.analyze.compile.estimate_passes import grouped_matmul_tiles, hbm_outside_vmem
    from tpudiag.api.pipeline import compile_run_artifacts

    arts, report = compile_run_artifacts(MAXTEXT_RUN, with_llo=False, suggestions=False)
    hlo = arts[0].hlo
    report, _ = hbm_outside_vmem(report, hlo)
    before = {o.name: o for o in report.modules[0].ops}
    after, note = grouped_matmul_tiles(report, hlo)
    assert note.startswith("12 grouped matmul(s) on a grid sized by the routing") and "1.88x-1.88x" in note
    assert "9 with the kernel's tiles in its metadata take the bytes its pipeline moves" in note
    peak = report.target.peak_bf16_flops_per_s
    timed = [o for o in after.modules[0].ops if "row-tile visits" in o.limit]
    assert len(timed) == 12
    for o in timed:
        assert o.opcode == "custom-call" and o.bound_by == "compute"
        assert o.estimated_s == pytest.approx(max(o.flops * 15 / 8 / peak, before[o.name].estimated_s
                                                  if o.name.startswith("tgmm") else 0), rel=1e-6)
        assert "15 row-tile visits of 512 rows (8 tiles, 8 groups)" in o.limit
        if o.name.startswith("gmm"):
            assert o.bytes_accessed == 4 * 2**20 + 8 * 512 * 512 * 2 + 4 * 2**20
            assert o.hbm_bytes == 0
    untouched = [o for o in after.modules[0].ops if "row-tile visits" not in o.limit]
    assert all(before[o.name] == o for o in untouched)
