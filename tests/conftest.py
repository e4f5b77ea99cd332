"""Shared test set-up: the repository root, the fixture artifacts, and `--update-goldens`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "fixtures" / "artifacts"
PROGRAMS = ROOT / "fixtures" / "programs"
GOLDENS = Path(__file__).resolve().parent / "goldens"
# Every captured fixture run, and the one captured from a program that raised.
RUNS = ("mlp", "decoder", "collective", "raises")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden outputs instead of comparing")


@pytest.fixture
def update_goldens(request) -> bool:
    return request.config.getoption("--update-goldens")


@pytest.fixture
def in_root(monkeypatch):
    """Run from the repository root, so fixture paths in reports are the same relative paths as in goldens."""
    monkeypatch.chdir(ROOT)
    return ROOT


def xplane_of(run: str) -> Path:
    return next((ARTIFACTS / run / "trace").glob("plugins/profile/*/*.xplane.pb"))


def check_golden(path: Path, actual: str, update: bool) -> None:
    if update or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        if not update:
            pytest.fail(f"golden {path} did not exist; written now, review it and rerun")
        return
    expected = path.read_text()
    assert actual == expected, f"output differs from golden {path} (rerun with --update-goldens and review the diff)"
