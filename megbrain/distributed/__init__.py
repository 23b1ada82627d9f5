"""Data-parallel training across processes on MPI.

``megbrain.distributed`` maps MegBrain's multi-machine operators (``opr.collective_comm``,
``opr.remote_send`` / ``opr.remote_recv``) onto MPI through mpi4py, which is an optional
dependency (``pip install megbrain[distributed]``) imported only when a collective first
runs (:func:`mpi`). Run a program on several processes with ``mpiexec -n N python prog.py``.

How MegBrain's arguments map onto MPI:

* one communicator per ``key``: the first collective of a key splits it from
  ``MPI.COMM_WORLD`` (every process of the job takes part), ordered by the ``rank``
  argument; keys first used in a different order on different ranks (collectives run on
  several comp nodes' threads) still get the same communicators (:func:`get_comm`);
* ``rank`` and ``nr_devices`` are that communicator's rank and size and must agree with it
  (an error names the key otherwise); ``server_addr`` and ``port`` are accepted and unused;
* ``config.create_mm_server`` returns the port it was given and starts nothing;
  ``config.group_barrier`` is an MPI barrier;
* a rank that fails ends the whole job: :func:`install_abort_on_error` prints the error with
  the rank and calls ``COMM_WORLD.Abort``; collective waits time out after
  :data:`COMM_TIMEOUT` seconds (environment ``MGB_COMM_TIMEOUT``) and abort the job too.
"""

from __future__ import annotations

from ..device.mpi_comm import (
    COMM_STREAM,
    comm_comp_node,
    get_comm,
    group_barrier,
    install_abort_on_error,
    is_distributed,
    mpi,
    world_rank,
    world_size,
)

_LAZY = {
    "DEFAULT_PACK_MAX_SIZE": ".parallel",
    "all_reduce_mean": ".parallel",
    "bcast_params": ".parallel",
    "data_parallel": ".parallel",
    "limit_threads_per_rank": ".parallel",
    "SyncBatchNorm": "..nn",  # a layer: it lives in nn, beside BatchNorm
}


def __getattr__(name):
    # the training layer imports megbrain itself: loaded on first use, after the package
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'megbrain.distributed' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)


__all__ = [
    "DEFAULT_PACK_MAX_SIZE",
    "SyncBatchNorm",
    "all_reduce_mean",
    "bcast_params",
    "data_parallel",
    "limit_threads_per_rank",
    "COMM_STREAM",
    "comm_comp_node",
    "get_comm",
    "group_barrier",
    "install_abort_on_error",
    "is_distributed",
    "mpi",
    "world_rank",
    "world_size",
]
