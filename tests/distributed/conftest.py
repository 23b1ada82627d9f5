"""Tests of megbrain.distributed run under MPI: ``mpiexec -n 2 python -m pytest -p no:randomly
tests/distributed``. In a plain ``pytest`` run (one process) the files needing several ranks
are skipped; ``test_dist_abort.py`` launches mpiexec itself."""

from __future__ import annotations

import pytest
from mpi_harness import LAUNCHED, mpi_size


def pytest_collection_modifyitems(config, items):
    size = mpi_size()
    for item in items:
        need = item.get_closest_marker("mpi")
        if need is None:
            continue
        n = need.kwargs.get("min_size", 2)
        if size < n:
            item.add_marker(pytest.mark.skip(reason=f"needs mpiexec -n >= {n} (size {size})"))


def pytest_configure(config):
    if LAUNCHED and config.pluginmanager.has_plugin("randomly"):
        # each rank would shuffle the tests differently and wait in different collectives
        raise pytest.UsageError("under mpiexec, run pytest with -p no:randomly")
    config.addinivalue_line("markers", "mpi(min_size=2): runs under mpiexec with that many ranks")
