"""A rank that fails, is killed or hangs ends the whole MPI job with a non-zero exit, naming
the rank, well within 60 s. Each case launches ``mpiexec -n 2`` itself (so these tests run in
the plain single-process ``pytest`` run, and are skipped inside mpiexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from mpi_harness import LAUNCHED

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = [
    pytest.mark.skipif(LAUNCHED, reason="launches mpiexec itself"),
    pytest.mark.skipif(
        not (os.path.exists(MPIEXEC) or shutil.which("mpiexec")), reason="no mpiexec"
    ),
]

PRELUDE = """
import os, signal, sys, time
import numpy as np
import megbrain as mgb
from megbrain import distributed as dist
dist.install_abort_on_error()
rank, n = dist.world_rank(), dist.world_size()
g = mgb.comp_graph()
x = mgb.make_shared("cpu0", value=np.ones(4, "float32"), comp_graph=g)
y = mgb.opr.collective_comm(x, key="k", nr_devices=n, is_root=rank == 0, rank=rank,
                            mode="ALL_REDUCE_SUM")
f = g.compile(None, [mgb.copy_output(y)])
f()  # both ranks reach the first all-reduce
"""


def _run(body: str, timeout_env: str = "50"):
    code = PRELUDE + textwrap.dedent(body)
    mpiexec = MPIEXEC if os.path.exists(MPIEXEC) else shutil.which("mpiexec")
    env = {**os.environ, "MGB_COMM_TIMEOUT": timeout_env, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=90)
    return out, time.monotonic() - t0


def test_exception_on_one_rank_ends_the_job():
    out, dt = _run("""
        if rank == 1:
            raise RuntimeError("boom on purpose")
        f()  # rank 0 waits in the next all-reduce
        print("rank 0 finished")
    """)
    assert out.returncode != 0
    assert "[megbrain rank 1] uncaught exception" in out.stderr
    assert "boom on purpose" in out.stderr
    assert "rank 0 finished" not in out.stdout
    assert dt < 60


def test_killed_rank_ends_the_job():
    out, dt = _run("""
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        f()
        print("rank 0 finished")
    """)
    assert out.returncode != 0
    assert "rank 0 finished" not in out.stdout
    assert dt < 60


def test_hanging_rank_ends_the_job_by_the_watchdog():
    out, dt = _run("""
        if rank == 1:
            time.sleep(120)  # never reaches the collective
        f()
        print("rank 0 finished")
    """, timeout_env="10")  # long enough for skewed start-up under load
    assert out.returncode != 0
    assert "[megbrain rank 0]" in out.stderr and "no answer from the other ranks" in out.stderr
    assert "ALL_REDUCE_SUM" in out.stderr
    assert dt < 60
