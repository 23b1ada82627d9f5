"""Fixtures shared by every test directory."""

from __future__ import annotations

import importlib
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmark_module(monkeypatch):
    """``load(name)``: the script ``benchmarks/<name>.py`` imported as a module, with the
    benchmarks folder on ``sys.path`` for the test (the scripts import their siblings)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module
