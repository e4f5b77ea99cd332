"""The CI artifact bundle (`profile --ci`, `compile --ci`): write_bundle on real fixture runs.

Each test works on a copy of fixtures/artifacts/decoder (a profile run) or
fixtures/artifacts/compile_v5e_collective (a compile run) under tmp_path, with report.json and
report.md written from it as `profile` and `compile` write them; nothing is written into fixtures/.
The archives are read back with `tarfile` (random access and streaming) and, where installed, with
GNU gzip and tar: readers that are not ours.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import tarfile

import pytest

from tests.conftest import ARTIFACTS
from tpudiag import api
from tpudiag.capture import rundir
from tpudiag.capture.bundle import (BUNDLE, BUNDLE_INDEX, MB, PROGRAM_LOG_TAIL_BYTES, TIERS, tier_of,
                                    write_bundle)
from tpudiag.errors import InputError, UsageError

PROFILE_RUN, COMPILE_RUN = "decoder", "compile_v5e_collective"
DEFAULT = 50 * MB
REPORTS = [rundir.MANIFEST, rundir.REPORT, rundir.REPORT_MD]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The two fixture runs with their reports, written once per module (the analysis takes a second)."""
    from tpudiag.report.compile_markdown import render_compile_markdown

    root = tmp_path_factory.mktemp("pristine")
    for name in (PROFILE_RUN, COMPILE_RUN):
        run = root / name
        shutil.copytree(ARTIFACTS / name, run)
        report = api.load_report(run)
        if name == COMPILE_RUN:  # as api.compile_target writes them
            doc = report.to_dict()
            rundir.write_json_atomic(run / rundir.REPORT, doc)
            rundir.write_text_atomic(run / rundir.REPORT_MD, render_compile_markdown(report))
        else:
            api.write_report(report, run)
    return root


@pytest.fixture
def run_copy(pristine, tmp_path):
    def copy(name: str):
        dst = tmp_path / name
        shutil.copytree(pristine / name, dst)
        return dst

    return copy


def _run_files(run) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and not p.name.startswith(BUNDLE)}


def _members(path, top: str) -> dict[str, bytes]:
    """{run-relative path: content} in archive order, read with tarfile's random-access reader."""
    out = {}
    with tarfile.open(path, "r:gz") as tar:
        for m in tar.getmembers():
            assert m.isfile() and m.name.startswith(f"{top}/"), m.name
            out[m.name[len(top) + 1:]] = tar.extractfile(m).read()
    return out


def _streamed_names(path) -> list[str]:
    with tarfile.open(path, "r|gz") as tar:  # the streaming reader: one pass, no seeking
        return [m.name for m in tar]


def _check_archive(res, run, budget: int) -> dict[str, bytes]:
    """What every bundle must satisfy; returns its members."""
    assert res.path == run / BUNDLE and res.bytes == res.path.stat().st_size <= budget
    assert not (run / (BUNDLE + ".tmp")).exists()
    members = _members(res.path, run.name)
    assert list(members) == res.included and res.included[-1] == BUNDLE_INDEX
    assert _streamed_names(res.path) == [f"{run.name}/{p}" for p in res.included]
    assert res.included[:3] == REPORTS
    files = _run_files(run)
    cut = {n.split(": ")[0] for n in res.notes}  # a long program.log, checked on its own below
    for rel in res.included[:-1]:
        if rel not in cut:
            assert members[rel] == files[rel], rel  # byte for byte
    assert set(res.included[:-1]) | {p for p, _ in res.left_out} == set(files)
    assert not set(res.included) & {p for p, _ in res.left_out}
    index = members[BUNDLE_INDEX].decode()
    n = len(res.left_out)
    assert f"left out: {n} file{'' if n == 1 else 's'}, " in index
    for rel, why in res.left_out:
        assert f"  {rel}  ({len(files[rel]):,} bytes): {why}\n" in index
    # Archive order is priority order (tiers never go back), BUNDLE.txt last.
    tiers = [tier_of(p) for p in res.included[:-1]]
    assert tiers == sorted(tiers)
    return members


# -- the default budget: the whole run ----------------------------------------------------------------


@pytest.mark.parametrize("name", [PROFILE_RUN, COMPILE_RUN])
def test_default_budget_bundles_the_whole_run(run_copy, name):
    run = run_copy(name)
    res = write_bundle(run, DEFAULT)
    _check_archive(res, run, DEFAULT)
    assert res.left_out == [] and res.notes == []
    assert set(res.included) == set(_run_files(run)) | {BUNDLE_INDEX}
    # The fixture runs are small: their whole bundles are ~0.3 MB (recheck if they are regenerated).
    assert 0.1 * MB < res.bytes < 0.5 * MB


def test_profile_bundle_order_reports_log_trace_then_hlo(run_copy):
    run = run_copy(PROFILE_RUN)
    inc = write_bundle(run, DEFAULT).included
    xplane = next(p for p in inc if p.endswith(".xplane.pb"))
    assert inc[:5] == [*REPORTS, "program.log", xplane]
    first_hlo = min(i for i, p in enumerate(inc) if p.endswith("after_optimizations.txt"))
    assert inc[5:first_hlo] and all(p.startswith("capture/") for p in inc[5:first_hlo])
    assert [p for p in inc if p.endswith(".mlir")] == inc[-5:-1]  # the IR inputs last


def test_compile_bundle_keeps_llo_summaries_before_final_bundles_and_compile_logs_last(run_copy):
    run = run_copy(COMPILE_RUN)
    inc = write_bundle(run, DEFAULT).included
    pos = {p: i for i, p in enumerate(inc)}
    summaries = [p for p in inc if re.search(r"/llo/.*-(static-per-bundle-utilization|schedule-analysis_final_bundles)"
                                             r"\.txt$", p)]
    bundles = [p for p in inc if p.endswith("-final_bundles.txt") and p not in summaries]
    assert summaries and bundles and max(pos[p] for p in summaries) < min(pos[p] for p in bundles)
    results = [p for p in inc if p.endswith(("/result.json", "/module.json")) or "/static_profile/" in p]
    assert max(pos[p] for p in results) < min(pos[p] for p in bundles)
    assert max(pos[p] for p in inc if p.endswith("optimized.hlo.txt")) < min(pos[p] for p in results)
    logs = [p for p in inc if p.endswith("/compile.log")]
    assert len(logs) == 9 and inc[-10:-1] == logs
    inputs = [p for p in inc if p.endswith("input.mlir")]
    assert max(pos[p] for p in bundles) < min(pos[p] for p in inputs) < min(pos[p] for p in logs)


def test_an_unpacked_bundle_is_a_run_that_re_renders_to_the_same_report(run_copy, tmp_path):
    run = run_copy(PROFILE_RUN)
    res = write_bundle(run, DEFAULT)
    with tarfile.open(res.path) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    again = api.load_report(tmp_path / "unpacked" / PROFILE_RUN).to_dict()
    original = json.loads((run / rundir.REPORT).read_text())
    assert again["artifacts"].pop("run_dir") != original["artifacts"].pop("run_dir")
    assert again == original


# -- a small budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [PROFILE_RUN, COMPILE_RUN])
def test_small_budget_leaves_out_low_priority_files_and_says_why(run_copy, name):
    run = run_copy(name)
    budget = int(0.2 * MB)
    res = write_bundle(run, budget)
    members = _check_archive(res, run, budget)
    assert res.left_out
    for rel, why in res.left_out:
        assert why.startswith(f"{TIERS[tier_of(rel)]}: over budget ("), why
        m = re.fullmatch(r".+ \((at least )?([\d,]+) bytes compressed; ([\d,]+) left\)", why)
        if m:  # else the rare "(gave way to BUNDLE.txt)": kept, then dropped when the index came out larger
            assert int(m.group(2).replace(",", "")) > int(m.group(3).replace(",", ""))  # it did not fit
    index = members[BUNDLE_INDEX].decode()
    assert f"budget: {budget:,} bytes compressed" in index
    if name == PROFILE_RUN:
        # The xplane fits; its Chrome-trace twin (115 kB, already gzipped) does not.
        assert [p for p, _ in res.left_out] == [p for p in _run_files(run) if p.endswith(".trace.json.gz")]
        assert any(p.endswith(".xplane.pb") for p in res.included)
    else:
        # Everything up to the LLO summaries fits; what goes is LLO final bundles (the big files).
        assert all(tier_of(p) >= TIERS.index("LLO bundles") for p, _ in res.left_out)
        assert any(p.endswith("-final_bundles.txt") for p, _ in res.left_out)


def test_a_trace_too_big_for_the_budget_does_not_push_out_the_hlo(run_copy):
    run = run_copy(PROFILE_RUN)
    res = write_bundle(run, int(0.1 * MB))
    _check_archive(res, run, int(0.1 * MB))
    left = [p for p, _ in res.left_out]
    assert any(p.endswith(".xplane.pb") for p in left)
    assert {p for p in _run_files(run) if p.endswith("after_optimizations.txt")} <= set(res.included)


@pytest.mark.parametrize("name", [PROFILE_RUN, COMPILE_RUN])
def test_the_budget_holds_at_every_size_from_the_reports_to_the_whole_run(run_copy, name):
    run = run_copy(name)
    whole = write_bundle(run, DEFAULT).bytes
    budgets = sorted({int(whole * f) for f in (0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 0.97)} | {whole - 1, whole + 1024})
    kept = []
    for budget in budgets:
        try:
            res = write_bundle(run, budget)
        except UsageError:  # below the reports: checked below
            continue
        _check_archive(res, run, budget)
        with gzip.open(res.path) as f:  # the CRC and length in the gzip trailer agree with the stream
            f.read()
        kept.append(len(res.included))
    assert len(kept) >= 6 and kept[-1] == len(_run_files(run)) + 1


# -- a budget too small for the reports ------------------------------------------------------------


@pytest.mark.parametrize("name", [PROFILE_RUN, COMPILE_RUN])
def test_a_budget_too_small_for_the_reports_is_a_usage_error_and_keeps_the_previous_bundle(run_copy, name):
    run = run_copy(name)
    before = write_bundle(run, DEFAULT).path.read_bytes()
    with pytest.raises(UsageError) as e:
        write_bundle(run, 2_000)
    msg = str(e.value)
    assert "\n" not in msg and "report.json" in msg and "--max-artifact-mb" in msg
    need = int(re.search(r"need ([\d,]+) bytes", msg).group(1).replace(",", ""))
    assert need > 2_000
    assert (run / BUNDLE).read_bytes() == before  # the old bundle stands; no half-written one
    assert not (run / (BUNDLE + ".tmp")).exists()
    minimum = float(re.search(r"at least ([\d.]+)$", msg).group(1))
    _check_archive(write_bundle(run, int(minimum * MB)), run, int(minimum * MB))  # the advice works


def test_zero_budget_and_a_directory_that_is_not_a_run(tmp_path, run_copy):
    with pytest.raises(UsageError, match="must be positive"):
        write_bundle(run_copy(PROFILE_RUN), 0)
    with pytest.raises(InputError, match="not a tpudiag run directory"):
        write_bundle(tmp_path, DEFAULT)
    assert not list(tmp_path.glob(BUNDLE + "*"))


# -- contents ----------------------------------------------------------------------------------------


def test_a_long_program_log_is_cut_to_its_last_megabyte_and_says_so(run_copy):
    run = run_copy(PROFILE_RUN)
    lines = [f"step {i} loss {1 / (i + 1):.6f}\n".encode() for i in range(150_000)]
    full = b"".join(lines)
    assert len(full) > 2 * PROGRAM_LOG_TAIL_BYTES
    (run / rundir.PROGRAM_LOG).write_bytes(full)
    res = write_bundle(run, DEFAULT)
    log = _members(res.path, run.name)[rundir.PROGRAM_LOG]
    head, _, kept = log.partition(b"\n")
    assert head.startswith(b"[tpudiag: program.log cut to its last") and f"{len(full):,}".encode() in head
    assert len(kept) <= PROGRAM_LOG_TAIL_BYTES and full.endswith(kept)
    assert kept == b"".join(lines[-len(kept.splitlines()):])  # whole lines, the last ones
    assert res.notes == [f"program.log: cut to its last {len(kept):,} of {len(full):,} bytes "
                         "(the whole log is in the run directory)"]
    assert res.notes[0] in _members(res.path, run.name)[BUNDLE_INDEX].decode()


def test_an_html_report_goes_in_after_the_markdown(run_copy):
    run = run_copy(PROFILE_RUN)
    html = "<!doctype html><title>decoder</title><p>tpudiag report</p>\n"
    res = write_bundle(run, DEFAULT, html=html)
    assert res.included[:4] == [*REPORTS, "report.html"]
    assert _members(res.path, run.name)["report.html"] == html.encode()
    assert not (run / "report.html").exists()  # the string goes into the archive only


def test_bundling_again_replaces_the_bundle_and_never_packs_the_old_one(run_copy):
    run = run_copy(COMPILE_RUN)
    first = write_bundle(run, DEFAULT)
    second = write_bundle(run, int(0.2 * MB))
    assert BUNDLE not in second.included and second.bytes < first.bytes
    assert (run / BUNDLE).stat().st_size == second.bytes


@pytest.mark.skipif(not (shutil.which("tar") and shutil.which("gzip")), reason="needs GNU tar and gzip")
def test_gnu_gzip_and_tar_read_the_bundle(run_copy, tmp_path):
    run = run_copy(COMPILE_RUN)
    res = write_bundle(run, int(0.1 * MB))
    subprocess.run(["gzip", "-t", str(res.path)], check=True)
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "-xzf", str(res.path), "-C", str(out)], check=True)
    unpacked = {p.relative_to(out / run.name).as_posix(): p.read_bytes()
                for p in (out / run.name).rglob("*") if p.is_file()}
    files = _run_files(run)
    assert set(unpacked) == set(res.included)
    assert all(unpacked[p] == files[p] for p in res.included[:-1])


@pytest.mark.parametrize("path, tier", [
    ("manifest.json", "reports"),
    ("report.md", "reports"),
    ("program.log", "program log"),
    ("shadow/program.log", "program log"),
    ("trace/plugins/profile/2026_11_30_05_29_31/vm.xplane.pb", "trace"),
    ("capture/monitoring.jsonl", "run records"),
    ("tpu/report.json", "run records"),
    ("hlo/module_0006.jit_train_step.cpu_after_optimizations.txt", "optimized HLO"),
    ("modules/08-jit_step/optimized.hlo.txt", "optimized HLO"),
    ("modules/08-jit_step/result.json", "module results and LLO summaries"),
    ("modules/08-jit_step/static_profile/fusion_static_llo_profile.textproto", "module results and LLO summaries"),
    ("modules/08-jit_step/llo/1796019539753113755-TLP-00-final_hlo-static-per-bundle-utilization.txt",
     "module results and LLO summaries"),
    ("modules/08-jit_step/llo/1796019539753113755-TLP-01-schedule-analysis_final_bundles.txt",
     "module results and LLO summaries"),
    ("hlo/module_0006.jit_train_step.cpu_after_optimizations-memory-usage-report.txt",
     "HLO memory reports and unoptimized HLO"),
    ("trace/plugins/profile/2026_11_30_05_29_31/vm.trace.json.gz", "Chrome trace"),
    ("modules/08-jit_step/llo/1796019539753113755-TLP-02-final_bundles.txt", "LLO bundles"),
    ("modules/08-jit_step/llo/1796019539753113755-TLP-03-vmem_report.html", "LLO bundles"),
    ("hlo/module_0006.jit_train_step.cpu_after_optimizations-buffer-assignment.txt", "other dumps"),
    ("ir/jax_ir0003_jit_train_step_compile.mlir", "IR inputs"),
    ("modules/08-jit_step/input.mlir", "IR inputs"),
    ("tpu/modules/00-jit_stage/input.hlo.txt", "IR inputs"),
    ("modules/08-jit_step/compile.log", "compile logs"),
])
def test_priority_of_each_kind_of_file(path, tier):
    assert TIERS[tier_of(path)] == tier
