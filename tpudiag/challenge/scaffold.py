"""`tpudiag challenge new DIR`: a task directory from a user's reference function and input spec:
task.json, reference.py (the user's file, copied), and solution.py, a placeholder that calls the
reference (so it is right, and integrity flags it until it is replaced). Writes only under DIR."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tpudiag.errors import InputError

_SOLUTION = '''"""Your solution of the {name} task: replace this call of the reference with your kernel.
`tpudiag challenge grade {directory} solution.py` grades it; a solution that imports the reference
fails integrity."""

from reference import {function} as _reference


def {function}({params}):
    return _reference({params})
'''


def scaffold(directory, reference: str, shapes: str, *, hidden=(), name: str | None = None) -> Path:
    """Write the task directory `directory`; `reference` is FILE.py:FUNC, `shapes` an input spec."""
    from tpudiag.parity import inputs as inp

    directory = Path(directory)
    file, _, function = reference.rpartition(":")
    if not file or not function.isidentifier():
        raise InputError(f"--reference {reference!r} is not FILE.py:FUNC")
    source = Path(file)
    if not source.is_file():
        raise InputError(f"--reference: {source}: no such file")
    if (directory / "task.json").exists():
        raise InputError(f"{directory}: a task is there already")
    specs = inp.parse_spec(shapes)
    for h in hidden:
        inp.parse_spec(h)
    name = name or directory.name
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, directory / "reference.py")
    doc = {"name": name, "title": f"{function} from {source.name}", "function": function,
           "statement": f"Write {function}({', '.join(s.name for s in specs)}) computing what "
                        f"reference.py:{function} computes, at any shape.",
           "reference": f"reference.py:{function}", "attribution": f"{source.name}:{function}, given by the user",
           "ground_truth": None, "public": shapes, "hidden": list(hidden),
           "dtypes": sorted({s.dtype for s in specs}), "forbidden": []}
    (directory / "task.json").write_text(json.dumps(doc, indent=2) + "\n")
    params = ", ".join(s.name for s in specs)
    (directory / "solution.py").write_text(_SOLUTION.format(name=name, directory=directory, function=function,
                                                            params=params))
    return directory
