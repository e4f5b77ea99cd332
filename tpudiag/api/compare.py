"""`tpudiag compare`'s inputs: a run directory (re-analyzed) or a report JSON file read as written.

Returns the report document of each side; the comparison itself is `analyze/compare/runs.py`.
"""

from __future__ import annotations

from pathlib import Path

from tpudiag.api import runs
from tpudiag.capture import rundir
from tpudiag.errors import InputError


def load_for_compare(path: Path):
    """`tpudiag compare`'s input as a `ProfileReport` or `CompileReport`: a run directory (re-analyzed,
    as `tpudiag report` does) or a report JSON file (`tpudiag.report/1` or `tpudiag.compile/1`, read
    as written and checked field by field once)."""
    import json

    from tpudiag.analyze.compare.runs import COMPILE_SCHEMA, PROFILE_SCHEMA
    from tpudiag.errors import ParseError

    run = runs.open_run(path)
    runs.refuse_job(run, "compare")
    path = run.path
    if path.is_dir():
        from tpudiag.api.load import load_report

        return load_report(run)
    try:
        doc = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise ParseError(path, f"not a JSON report: {e.msg}", line=e.lineno) from None
    except UnicodeDecodeError:
        raise ParseError(path, "not a JSON report: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in (PROFILE_SCHEMA, COMPILE_SCHEMA):
        raise InputError(f"{path}: not a tpudiag profile or compile report (schema {schema!r}; expected "
                         f"{PROFILE_SCHEMA} or {COMPILE_SCHEMA})")
    if schema == PROFILE_SCHEMA:
        from tpudiag.results.profile import ProfileReport

        return ProfileReport.from_dict(doc, str(path))
    from tpudiag.results.compile import CompileReport

    return CompileReport.from_dict(doc, str(path))


def compare_runs(base: Path, cur: Path, metric: str | None = None, max_regression: float = 0.05,
                 force: bool = False):
    """`tpudiag compare BASE CUR`: the `Comparison` (tpudiag.compare/1; analyze/compare/runs.py decides)."""
    from tpudiag.analyze.compare.runs import compare_reports

    handles = [runs.open_run(p) for p in (base, cur)]
    for h in handles:  # a multi-process job is refused first: it says which process to give
        runs.refuse_job(h, "compare")
    (a, id_a), (b, id_b) = (_run_identity(h) for h in handles)
    if (a == b or id_a is not None and id_a == id_b) and not force:
        same = f"({a})" if a == b else f"({b} is a copy of {a})"
        raise InputError(f"{cur}: BASE and CUR are the same run {same}; give the run to compare against as BASE "
                         "(--force compares a run with itself)")
    return compare_reports(load_for_compare(base), load_for_compare(cur), metric, max_regression, force,
                           base_path=str(base), cur_path=str(cur))


def _run_identity(handle) -> tuple[Path, tuple | None]:
    """The run directory a compare input stands for (a run's own report.json is its run), resolved,
    and a profile run's identity from its manifest (the host, tpudiag's and the program's process
    ids, when it started, which process of a job), which a copied run directory keeps: (path, None)
    where there is no such manifest."""
    path = handle.path.resolve()
    if not handle.is_run and path.name == rundir.REPORT and rundir.is_run_dir(path.parent):
        path = path.parent
    manifest = handle.manifest if handle.is_run else (rundir.read_manifest(path) if rundir.is_run_dir(path) else None)
    key = None if manifest is None else (manifest.host, manifest.pid, manifest.program_pid, manifest.started_at,
                                         manifest.process_id)
    return path, (None if key is None or None in key[:4] else key)
