"""`tpudiag export RUN --perfetto FILE`: the op timeline as a Chrome JSON trace for Perfetto."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

from tests.conftest import ARTIFACTS
from tpudiag import api
from tpudiag.cli import cli


@pytest.mark.parametrize("name", ["mlp.perfetto.json", "mlp.perfetto.json.gz"])
def test_every_op_instance_is_an_event_with_its_hlo_facts(tmp_path, name):
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["export", "--perfetto", str(out), str(ARTIFACTS / "mlp")])
    assert result.exit_code == 0, result.output
    raw = out.read_bytes()
    doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
    timeline = api.load_report(ARTIFACTS / "mlp").timeline
    ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "step"]
    assert len(ops) == len(timeline)
    assert sorted((e["name"], round(e["ts"] * 1e3)) for e in ops) == \
        sorted(zip(timeline["op"], timeline["start_ns"]))
    train = [e for e in ops if e["args"]["hlo_module"] == "jit_train_step"]
    assert train and all(e["args"]["source"] and e["args"]["category"] != "unknown" for e in train if
                         e["args"]["source"])
    assert {e["args"]["step"] for e in train} == {0, 1, 2}
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert [e["args"]["step"] for e in sorted(steps, key=lambda e: e["ts"])] == [0, 1, 2]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "Steps" in names and any(n.startswith("/device:CPU") for n in names)


def test_a_compile_run_has_no_timeline(tmp_path):
    result = CliRunner().invoke(cli, ["export", "--perfetto", str(tmp_path / "x.json"),
                                      str(ARTIFACTS / "compile_v5e_collective")])
    assert result.exit_code != 0 and not (tmp_path / "x.json").exists()


def test_perfettos_own_trace_processor_loads_it(tmp_path):
    """Perfetto's `trace_processor` must load and query the export. The `perfetto` package fetches
    its trace_processor_shell binary from the internet on first use; this workplace cannot reach it,
    so the check runs only where a trace_processor_shell is on PATH."""
    binary = shutil.which("trace_processor_shell")
    tp = pytest.importorskip("perfetto.trace_processor", reason="the perfetto package is not installed")
    if binary is None:
        pytest.skip("no trace_processor_shell on PATH (the perfetto package downloads it; no network here)")
    out = tmp_path / "t.json"
    api.perfetto_export(ARTIFACTS / "mlp", out)
    with tp.TraceProcessor(trace=str(out), config=tp.TraceProcessorConfig(bin_path=binary)) as proc:
        n = next(iter(proc.query("select count(*) as n from slice where name like 'dot%'"))).n
    assert n > 0
