"""`kernels bench` on a TPU, without one: the chip worker's rows and traces from a real v5e run
(fixtures/tpu-v5e/kernels_bench_chip, its README says how it was made) read back as the worker read
them, the verdicts they give, and how the report shows them; and the worker's refusal where no TPU
backend exists (a real worker process on this machine)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from tests.conftest import ROOT

RUN = ROOT / "fixtures" / "tpu-v5e" / "kernels_bench_chip"
TRACED = ("flash_attention", "paged_attention", "int8_matmul", "sampling", "rope")


def _rows() -> dict[tuple[str, str], dict]:
    out = {}
    for line in (RUN / "chip-bench.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("status") == "ok":
            out[(row["kernel"], row["variant"])] = row
    return out


@pytest.mark.parametrize("kernel", TRACED)
def test_device_times_come_from_the_traces_module_spans(kernel):
    """Each variant's times are its module's spans in the chip's trace, one per timed call."""
    from tpudiag.capture.chip_bench import _module_runs

    rows = {v: r for (k, v), r in _rows().items() if k == kernel}
    assert rows
    runs = _module_runs(RUN / "chip-traces" / kernel, {f"jit_tpudiag_bench_{kernel}_{v}" for v in rows})
    for variant, row in rows.items():
        us = [d / 1e3 for d in runs[f"jit_tpudiag_bench_{kernel}_{variant}"]]
        assert len(us) == row["calls"] == row["runs"]
        assert round(min(us), 2) == row["min_us"] and round(statistics.median(us), 2) == row["median_us"]
        assert row["wall_us"] > row["min_us"]  # the wall clock per call includes the host's dispatch


def test_a_variant_that_shares_an_earlier_variants_executable_gets_its_runs():
    """Two variants of one program run as one executable, named after the first: in the second's
    own trace, the first's module is the one that ran. Where two others ran, neither is taken."""
    from tpudiag.capture.chip_bench import _module_runs, runs_of

    trace = RUN / "chip-traces" / "rope"
    again, kernel, xla = (f"jit_tpudiag_bench_rope_{v}" for v in ("again", "kernel", "xla"))
    runs = _module_runs(trace, {again, kernel})
    assert runs[again] == [] and len(runs[kernel]) == _rows()[("rope", "kernel")]["calls"]
    assert runs_of(again, runs) == (kernel, runs[kernel])
    assert runs_of(kernel, runs) == (kernel, runs[kernel])
    assert runs_of(again, _module_runs(trace, {again, kernel, xla})) == (again, [])


def test_argument_sets_exceed_vmem_twice_within_the_budget():
    from tpudiag.capture.chip_bench import HBM_BUDGET, argument_sets

    vmem2 = 2 * 128 << 20
    assert argument_sets(12 << 20, vmem2) * (12 << 20) >= vmem2
    assert argument_sets(1 << 30, vmem2) == 2  # never fewer than two: a second buffer at least
    assert argument_sets(3 << 30, vmem2) == 1  # two would not fit the budget
    assert argument_sets(1 << 10, vmem2) == 64
    for r in _rows().values():
        assert r["buffers"] >= 2 or r["kernel"] == "fused_moe"


def _row(kernel: str, floor_us: float | None = None):
    from tpudiag.analyze.compile.kernel_bench import chip_time, kernel_row, with_chip

    row = kernel_row(kernel, "", None, "jax" if any(k == kernel and v == "jax" for k, v in _rows()) else None, {})
    if floor_us is not None:
        row = dataclasses.replace(row, floor_cycles=round(floor_us * 1.5e3))  # at 1.5 GHz
    times = {v: chip_time(r) for (k, v), r in _rows().items() if k == kernel}
    return with_chip(row, times, 1.5e9)


def test_chip_verdicts_from_real_times():
    rows = _rows()
    flash = _row("flash_attention")
    assert flash.chip_ratio_vs_jax == round(rows[("flash_attention", "kernel")]["min_us"]
                                            / rows[("flash_attention", "jax")]["min_us"], 4)
    assert flash.meets_jax_goal_on_chip and flash.chip_ratio_vs_jax < 0.6
    rpa = _row("ragged_paged_attention")  # 1.74x JAX's own kernel on the chip
    assert rpa.chip_ratio_vs_jax > 1.5 and rpa.meets_jax_goal_on_chip is False and rpa.missed_goal
    # % of floor: the floor over our fastest call; 80% is the goal
    int8 = _row("int8_matmul", floor_us=75.0)
    assert int8.pct_of_floor == round(100 * 75.0 / rows[("int8_matmul", "kernel")]["min_us"], 1)
    assert int8.meets_floor_goal and not int8.missed_goal
    slow = _row("mla_decode", floor_us=100.0)
    assert slow.meets_floor_goal is False and slow.missed_goal
    assert slow.static_over_chip is None  # no static figures in the row


def test_the_report_shows_the_chip_table_first():
    from rich.console import Console

    from tpudiag.analyze.compile.kernel_bench import bench_document
    from tpudiag.report.kernels_render import render_bench, render_bench_markdown

    doc = bench_document({"chip": "v5e", "topology": "v5e:2x2", "clock_hz": 1.5e9},
                         [_row("flash_attention"), _row("ragged_paged_attention")], False, "TPU v5 lite")
    assert doc.timing == "chip" and doc.goals_missed == ("ragged_paged_attention",)
    console = Console(width=200, record=True, color_system=None)
    render_bench(doc, console)
    text = console.export_text()
    assert text.index("on the chip (TPU v5 lite)") < text.index("corrected estimated cycles")
    assert "58.1 / 58.1" in text and "1.74x MISS" in text and "missed by ragged_paged_attention" in text
    md = render_bench_markdown(doc)
    assert md.startswith("### On the chip: TPU v5 lite") and "| ragged_paged_attention | 1,568.0 / 1,568.1 |" in md
    again = type(doc).from_dict(json.loads(json.dumps(doc.to_dict())), "bench")
    assert again.kernels[0].chip["kernel"].min_us == doc.kernels[0].chip["kernel"].min_us


def test_no_tpu_backend_is_one_line(tmp_path):
    """The chip worker, started for real on a machine without a TPU, exits 3; the bench says why."""
    from tpudiag.api.kernels_chip import chip_times
    from tpudiag.errors import InputError

    with pytest.raises(InputError, match="no TPU backend here") as e:
        chip_times(["rmsnorm"], "v5e", 3, 1 << 20, tmp_path)
    assert "\n" not in str(e.value)
