"""The LLO dump parsers, held to independent reads of the real TPU compiler dump in fixtures/artifacts/llo_v5e.

The dump comes from fixtures/programs/tpu_compile_dump.py (an MLP, a fori_loop and an all-reduce
compiled for v5e 2x2). The oracles are plain regexes over the same files; the bad inputs are
real files cut or overwritten in tmp_path.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ARTIFACT_SETS, ARTIFACTS
from tpudiag.errors import InputError, ParseError
from tpudiag.parse.frames import check_frame
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
from tpudiag.parse.llo import (LLO_PROGRAMS, SLOTS, STATIC_PROFILES, read_llo_dump, read_static_profiles,
                               read_vmem_report)

# The bad-input tests cut files of the jax 0.10.2 set; the oracle tests run on both sets (libtpu
# 0.0.50 adds the device kind to static-profile file names: `fusion.4_TPU v5 lite_static_llo_...`).
DUMP = ARTIFACTS / "llo_v5e"
PROFILES = DUMP / "static_profile"
LLO = DUMP / "llo"


@pytest.fixture(scope="module", params=list(ARTIFACT_SETS))
def dump(request) -> Path:
    return ARTIFACT_SETS[request.param] / "llo_v5e"


@pytest.fixture(scope="module")
def profiles(dump):
    return read_static_profiles(dump / "static_profile")


@pytest.fixture(scope="module")
def programs(dump):
    return read_llo_dump(dump / "llo")


def _oracle_cycles(profiles_dir: Path) -> dict[str, int]:
    """op -> estimated_cycles, read with a regex from the top level (two-space indent) of each file."""
    out = {}
    for path in profiles_dir.glob("*_static_llo_profile.textproto"):
        text = path.read_text()
        names = re.findall(r'^  hlo_op_name: "([^"]*)"$', text, re.M)
        cycles = re.findall(r"^  estimated_cycles: (\d+)$", text, re.M)
        assert len(names) == len(cycles) == 1, path
        out[names[0]] = int(cycles[0])
    return out


def _scheduled_instructions(module):
    """Instructions of the computations the TPU compiler schedules as programs: the entry and the
    bodies and conditions of its control flow (not fusion bodies or reducers)."""
    by_name = module.computations
    todo, seen = [module.entry.name], set()
    while todo:
        comp = by_name[todo.pop()]
        if comp.name in seen:
            continue
        seen.add(comp.name)
        for instr in comp.instructions:
            yield instr
            if instr.opcode in ("while", "conditional", "call"):
                todo += instr.called


@pytest.fixture(scope="module")
def modules(dump):
    return {m.name: m for m in map(read_hlo_file, find_optimized_modules(dump / "hlo").values())}


# --- static profiles ---------------------------------------------------------------------------

def test_static_cycles_equal_the_textproto_values(profiles, dump):
    oracle = _oracle_cycles(dump / "static_profile")
    assert len(oracle) >= 8
    assert dict(zip(profiles.op, profiles.estimated_cycles)) == oracle
    assert profiles.estimated_cycles.sum() == sum(oracle.values())
    check_frame(profiles, STATIC_PROFILES, "static LLO profile")


def test_zero_cycles_with_remote_dma_is_marked_missing(profiles, dump):
    # The all-reduce is the only op with a remote DMA; its file nests a whole hlo_instruction
    # whose own `name:`/`metadata {...}` fields must not leak into the row.
    remote = profiles[profiles.dma_instruction_type.str.contains("REMOTE")]
    assert list(remote.op) == ["all-reduce"]
    assert remote.estimate_missing.all() and (remote.estimated_cycles == 0).all()
    assert "hlo_instruction {" in (dump / "static_profile" / remote.file.iloc[0]).read_text()
    assert not profiles[profiles.op != "all-reduce"].estimate_missing.any()
    assert (profiles.num_equivalent_hlos == 1).all()


def test_every_scheduled_fusion_has_a_profile_row(profiles, modules):
    assert set(modules) == {"jit_mlp", "jit_loop", "jit_allreduce"}
    fusions = {i.name for m in modules.values() for i in _scheduled_instructions(m) if i.opcode == "fusion"}
    # fusion.4/2/1 (mlp) and convolution_tanh_fusion.2, which sits in the while body of jit_loop.
    assert {"fusion.4", "convolution_tanh_fusion.2"} <= fusions
    assert fusions <= set(profiles.op)
    scheduled = {i.name for m in modules.values() for i in _scheduled_instructions(m)}
    assert set(profiles.op) <= scheduled


def test_several_estimates_in_one_file(tmp_path, dump):
    a, b = (next((dump / "static_profile").glob(f"{op}_*static_llo_profile.textproto")) for op in ("fusion.4", "all-reduce"))
    (tmp_path / "both_static_llo_profile.textproto").write_text(a.read_text() + b.read_text())
    df = read_static_profiles(tmp_path)
    assert list(df.op) == ["fusion.4", "all-reduce"]
    assert list(df.estimate_missing) == [False, True]
    assert set(df.file) == {"both_static_llo_profile.textproto"}


# --- LLO programs ------------------------------------------------------------------------------

def _schedule_oracle(llo: Path) -> dict[tuple[int, str], int]:
    out = {}
    for path in llo.glob("*-schedule-analysis_final_bundles.txt"):
        m = re.match(r"^(\d+)-(.+)-\d+-schedule-analysis_final_bundles\.txt$", path.name)
        out[(int(m.group(1)), m.group(2))] = int(re.search(r"total scheduled bundles:\s*(\d+)", path.read_text())[1])
    return out


def test_one_row_per_program_with_schedule_analysis_bundle_counts(programs, dump):
    oracle = _schedule_oracle(dump / "llo")
    assert dict(zip(zip(programs.dump_id, programs.program), programs.bundles)) == oracle
    assert {"all-reduce", "<late-finalization>", "TLP", "fusion.4"} <= set(programs.program)
    check_frame(programs, LLO_PROGRAMS, "LLO program")


def test_bundle_lines_in_final_bundles_match_the_count(programs, dump):
    for row in programs.itertuples():
        text = (dump / "llo" / row.file).read_text()
        assert len(re.findall(r"^\s*(?:0x[0-9a-f]+|0) +(?:[A-Z]{2})?:", text, re.M)) == row.bundles, row.file


def test_programs_belong_to_their_module(programs, modules):
    ops = programs[programs.kind == "op"]
    assert set(programs.module) == set(modules)
    for row in ops.itertuples():
        assert row.program in {i.name for i in modules[row.module].instructions()}, (row.module, row.program)
    assert (programs.groupby("module").kind.apply(lambda k: (k == "tlp").sum()) == 1).all()


def test_utilization_is_a_fraction_of_capacity(programs):
    assert [f"cap_{s}" for s in SLOTS] == [c for c in programs.columns if c.startswith("cap_")]
    for s in SLOTS:
        u = programs[f"util_{s}"]
        assert u.notna().all() and u.between(0, 1).all(), s
    # v5e: 4 MXUs per core, one vector-store slot.
    assert (programs.cap_mxu == 4).all() and (programs.cap_vstore == 1).all()
    # The MLP's matmul fusion keeps the MXUs busy; the softmax fusions do not use them.
    mlp = programs[programs.module == "jit_mlp"].set_index("program")
    assert mlp.util_mxu["fusion.4"] > 0.5 and mlp.util_mxu["fusion.1"] == 0


def test_utilization_equals_a_naive_sum(programs, dump):
    row = programs[programs.program == "fusion.4"].iloc[0]
    path = next((dump / "llo").glob(f"{row.dump_id}-fusion.4-*-final_hlo-static-per-bundle-utilization.txt"))
    lines = path.read_text().splitlines()
    names = [n.strip().lower().replace(":", "_") for n in lines[1].split(",")]
    counts = np.array([list(map(int, ln.split())) for ln in lines[4:] if ln.strip()])
    caps = np.array(list(map(int, lines[2].split())))
    for name, total, cap in zip(names, counts.sum(axis=0), caps):
        assert row[f"util_{name}"] == pytest.approx(total / (len(counts) * cap))


def test_spills_match_spill_slot_accesses_in_the_bundles(programs, dump):
    assert programs.spill_stores.sum() > 0
    for row in programs.itertuples():
        text = (dump / "llo" / row.file).read_text()
        assert row.spill_stores == len(re.findall(r"= vst \[vmem:\[#allocation\d+_spill\]", text)), row.file
        assert row.spill_loads == len(re.findall(r"= vld \[vmem:\[#allocation\d+_spill\]", text)), row.file


def test_loops_and_instruction_counts(programs, dump):
    tlp = programs[programs.kind == "tlp"].set_index("module")
    assert tlp.loops["jit_loop"] >= 1 and tlp.max_loop_depth["jit_loop"] == 1
    assert tlp.loops["jit_mlp"] == 0
    # The all-reduce's top-level program waits on cross-chip barriers in nested loops.
    assert tlp.max_loop_depth["jit_allreduce"] == 2
    mm = programs[programs.program == "fusion.4"].iloc[0]
    text = (dump / "llo" / mm.file).read_text()
    assert mm.n_vmatmul == len(re.findall(r"= vmatmul\.", text)) > 0
    assert mm.n_vmatpush == len(re.findall(r"= vmatpush\.", text)) > 0
    assert mm.n_mxu_pop == len(re.findall(r"= vpop\.f32\.mrf\.mxu\d", text)) > 0
    assert mm.n_dma_wait == len(re.findall(r"= dma\.done\.wait ", text))
    assert programs.n_dma_start.sum() > 0


def test_vmem_report(dump):
    reports = {r["module"]: r for r in map(read_vmem_report, (dump / "llo").glob("*-vmem_report.html"))}
    assert set(reports) == {"jit_mlp", "jit_loop", "jit_allreduce"}
    mlp = reports["jit_mlp"]
    text = next(p for p in (dump / "llo").glob("*-vmem_report.html") if '"jit_mlp"' in p.read_text()).read_text()
    assert mlp["peak_bytes"] == max(map(int, re.findall(r'"total_size": (\d+)', text)))
    assert mlp["vmem_capacity_bytes"] == int(re.search(r'"vmem_capacity": (\d+)', text)[1])
    assert mlp["ops"]["fusion.4"]["scoped_bytes"] > 0


# --- bad input ---------------------------------------------------------------------------------

def _copy_program(tmp_path, program: str):
    """The three LLO files of one real program, copied into tmp_path: label -> path."""
    out = {}
    for path in LLO.glob(f"*-{program}-*.txt"):
        if re.match(rf"^\d+-{re.escape(program)}-\d+-", path.name):
            shutil.copy(path, tmp_path / path.name)
            out[path.name.split("-", 3)[3]] = tmp_path / path.name
    assert len(out) == 3, out
    return {k.removesuffix(".txt"): v for k, v in out.items()}


def _raises(fn, path, line):
    with pytest.raises(ParseError) as e:
        fn()
    assert e.value.path == str(path) and e.value.line == line, str(e.value)
    assert str(path) in str(e.value)
    return e.value


def test_truncated_textproto(tmp_path):
    text = (PROFILES / "all-reduce_static_llo_profile.textproto").read_text()
    cut = "\n".join(text.splitlines()[:20]) + "\n"
    bad = tmp_path / "all-reduce_static_llo_profile.textproto"
    bad.write_text(cut)
    err = _raises(lambda: read_static_profiles(tmp_path), bad, 20)
    assert "not closed" in err.problem


def test_garbage_in_a_textproto(tmp_path):
    lines = (PROFILES / "fusion.4_static_llo_profile.textproto").read_text().splitlines()
    n = next(i for i, ln in enumerate(lines) if "estimated_cycles" in ln)
    lines[n] = "  estimated_cycles: lots"
    bad = tmp_path / "fusion.4_static_llo_profile.textproto"
    bad.write_text("\n".join(lines))
    _raises(lambda: read_static_profiles(tmp_path), bad, n + 1)
    lines[n] = '  estimated_cycles: "12'
    bad.write_text("\n".join(lines))
    _raises(lambda: read_static_profiles(tmp_path), bad, n + 1)
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    _raises(lambda: read_static_profiles(tmp_path), bad, None)
    bad.write_text("")
    _raises(lambda: read_static_profiles(tmp_path), bad, None)


def test_truncated_final_bundles(tmp_path):
    files = _copy_program(tmp_path, "fusion.1")
    path = files["final_bundles"]
    lines = path.read_text().splitlines()
    # Cut inside a bundle line: the bundle is not closed.
    path.write_text("\n".join(lines[:200]) + "\n" + lines[200][:40])
    _raises(lambda: read_llo_dump(tmp_path), path, 201)
    # Cut at a line boundary: fewer bundles than the schedule analysis counts.
    path.write_text("\n".join(lines[:200]) + "\n")
    err = _raises(lambda: read_llo_dump(tmp_path), path, 200)
    assert "schedule analysis" in err.problem


def test_garbage_in_final_bundles(tmp_path):
    files = _copy_program(tmp_path, "copy.9")
    path = files["final_bundles"]
    lines = path.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("0 "))
    lines.insert(first, "this is not a bundle")
    path.write_text("\n".join(lines))
    _raises(lambda: read_llo_dump(tmp_path), path, first + 1)
    lines = path.read_text().splitlines()
    del lines[first]
    lines[first + 2] = lines[first + 2].replace("0x2 ", "0x7 ", 1)  # a bundle out of sequence
    path.write_text("\n".join(lines))
    _raises(lambda: read_llo_dump(tmp_path), path, first + 3)


def test_truncated_utilization(tmp_path):
    files = _copy_program(tmp_path, "fusion.2")
    path = files["final_hlo-static-per-bundle-utilization"]
    text = path.read_text()
    lines = text.splitlines()
    path.write_text("\n".join(lines[:100]) + "\n" + lines[100][:5])
    _raises(lambda: read_llo_dump(tmp_path), path, 101)
    path.write_text("\n".join(lines[:100]))
    _raises(lambda: read_llo_dump(tmp_path), path, 100)
    path.write_text(text.replace("== UTILIZATION:", "== USAGE:"))
    _raises(lambda: read_llo_dump(tmp_path), path, 4)


def test_garbage_schedule_analysis(tmp_path):
    files = _copy_program(tmp_path, "fusion.2")
    path = files["schedule-analysis_final_bundles"]
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1]))
    _raises(lambda: read_llo_dump(tmp_path), path, 1)
    path.write_text("\n".join([lines[0], "\ttotal scheduled bundles:    many", *lines[2:]]))
    _raises(lambda: read_llo_dump(tmp_path), path, 2)
    path.write_text("garbage\n")
    _raises(lambda: read_llo_dump(tmp_path), path, 1)


def test_truncated_vmem_report(tmp_path):
    src = next(LLO.glob("*-vmem_report.html"))
    text = src.read_text()
    bad = tmp_path / src.name
    cut = text.index('"hlo_breakdowns"') + 40
    bad.write_text(text[:cut])
    err = _raises(lambda: read_vmem_report(bad), bad, text[:cut].count("\n") + 1)
    assert "JSON" in err.problem
    bad.write_text(text.replace("const DATA", "const OTHER"))
    _raises(lambda: read_vmem_report(bad), bad, None)


def test_missing_inputs(tmp_path):
    with pytest.raises(InputError):
        read_llo_dump(tmp_path / "absent")
    with pytest.raises(InputError):
        read_static_profiles(tmp_path / "absent")
    files = _copy_program(tmp_path, "fusion.2")
    files["final_bundles"].unlink()
    with pytest.raises(InputError, match="final_bundles"):
        read_llo_dump(tmp_path)
    assert read_static_profiles(tmp_path).empty


def test_a_line_of_prose_in_a_textproto(tmp_path):
    lines = (PROFILES / "all-reduce_static_llo_profile.textproto").read_text().splitlines()
    lines.insert(10, "this line is not text-format protobuf")
    bad = tmp_path / "all-reduce_static_llo_profile.textproto"
    bad.write_text("\n".join(lines))
    _raises(lambda: read_static_profiles(tmp_path), bad, 11)
