"""Shared helpers of the MPI tests: the job's size without importing mpi4py outside mpiexec."""

from __future__ import annotations

import os

LAUNCHED = any(k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"))


def mpi_size() -> int:
    """The MPI job's size; 1 when not started by mpiexec or without mpi4py."""
    if not LAUNCHED:
        return 1
    try:
        from mpi4py import MPI
    except ImportError:
        return 1
    return MPI.COMM_WORLD.Get_size()


def ctx() -> tuple[int, int]:
    """(rank, size) in COMM_WORLD."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
