"""Run directories written by an earlier tpudiag (fixtures/old-runs/, commit e0a2482) still open:
`tpudiag report` gives the same documents as the reports built from the same artifacts in the
fixture set, and `tpudiag compare` reads them as either side."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACTS, ROOT
from tpudiag.cli import cli

OLD = ROOT / "fixtures" / "old-runs"


def _report(path) -> dict:
    result = CliRunner().invoke(cli, ["report", "--json", str(path)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("old,same", [("profile-e0a2482", "mlp"), ("compile-e0a2482", "compile_v5e_collective")])
def test_old_run_reports_as_before(old, same):
    mine, theirs = _report(OLD / old), _report(ARTIFACTS / same)
    for doc in (mine, theirs):  # the only fields that name where the run lies
        doc["artifacts"].pop("run_dir", None)
        if doc.get("suggestions"):
            doc["suggestions"].pop("run_dir", None)
        for m in doc.get("modules", []):
            m["artifacts"] = m["artifacts"].rsplit("/modules/", 1)[-1]
    assert mine == theirs
    assert json.loads((OLD / old / "manifest.json").read_text())["status"] == "ok"


def test_old_runs_compare_with_new_ones():
    for args in ([str(OLD / "profile-e0a2482"), str(ARTIFACTS / "mlp")],
                 [str(OLD / "compile-e0a2482"), str(ARTIFACTS / "compile_v5e_collective")]):
        result = CliRunner().invoke(cli, ["compare", "--json", *args])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        assert doc["schema"] == "tpudiag.compare/1" and doc["regression"] is False


# A profile --target v5e run of fixtures/programs/decoder.py --steps 2 as tpudiag at commit 08cd88e
# wrote it (trimmed like the fixture set), and what that tpudiag printed for it: every command
# that reads a run gives byte-for-byte the same document today, except where the analysis was
# changed on purpose (`git log fixtures/old-runs/expected-08cd88e` says where; `--update-goldens`
# rewrites them). `{RUN}` stands for the run's path.
DECODER = OLD / "profile-decoder-08cd88e"
EXPECTED = OLD / "expected-08cd88e"
_RUN_COMMANDS = {
    "report.json": ["report", "--json", "{RUN}"],
    "report.md": ["report", "--md", "{RUN}"],
    "tpu-report.json": ["report", "--json", "{RUN}/tpu"],
    "suggest.json": ["suggest", "--all", "--json", "{RUN}"],
    "tpu-suggest.json": ["suggest", "--all", "--json", "{RUN}/tpu"],
    "fusions.json": ["fusions", "--json", "{RUN}"],
    "tpu-fusions.json": ["fusions", "--json", "{RUN}/tpu"],
    "hlo-diff.json": ["hlo-diff", "--json", "--module", "jit_train_step", "{RUN}", "{RUN}/tpu"],
    "compare.json": ["compare", "--force", "--json", "{RUN}", "{RUN}"],
    "compare.md": ["compare", "--force", "--md", "{RUN}", "{RUN}"],
}


def _expected_file(name: str):
    """What 08cd88e printed with this leg's jax. `jax-0.12/` holds the outputs that differ there:
    suggest compiles the bundled kernels with the installed libtpu, and Python 3.12's `sum` rounds
    hlo-diff's time totals differently."""
    import jax

    newest = EXPECTED / "jax-0.12" / f"{name}.gz"
    if tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 11) and newest.is_file():
        return newest
    return EXPECTED / f"{name}.gz"


@pytest.mark.parametrize("name", sorted(_RUN_COMMANDS))
def test_run_from_08cd88e_gives_the_same_output(name, update_goldens):
    import gzip

    run = str(DECODER)
    args = [a.replace("{RUN}", run) for a in _RUN_COMMANDS[name]]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    actual = result.stdout.replace(run, "{RUN}")  # what was printed; stderr has the progress lines
    if update_goldens:
        _expected_file(name).write_bytes(gzip.compress(actual.encode(), mtime=0))
    expected = gzip.decompress(_expected_file(name).read_bytes()).decode()
    assert actual == expected
