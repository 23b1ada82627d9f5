"""Thread caps per rank, checked in a fresh process (no MPI job needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_limit_threads_per_rank_covers_pools_loaded_later():
    """A BLAS loaded after the cap (SciPy's own OpenBLAS, scikit-learn's OpenMP: the digits
    example imports them to load its data) gets the capped count too, and so do the
    kernels, whose split follows the largest BLAS pool."""
    pytest.importorskip("scipy.linalg")
    from megbrain.distributed.parallel import THREAD_ENV

    code = (
        "import json, numpy\n"
        "from megbrain.distributed import limit_threads_per_rank\n"
        "n = limit_threads_per_rank()\n"
        "import scipy.linalg\n"
        "from threadpoolctl import threadpool_info\n"
        "from megbrain.kernels import parallel\n"
        "print(json.dumps([n, parallel.num_threads(), "
        "[(i['prefix'], i['num_threads']) for i in threadpool_info()]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env = {k: v for k, v in env.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_"))}
    env["MPI_LOCALNRANKS"] = "2"  # two ranks on this machine: half the cores each
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    n, kernels, pools = json.loads(out.stdout.strip().splitlines()[-1])
    assert n == max(1, len(os.sched_getaffinity(0)) // 2)
    assert any("openblas" in p for p, _ in pools)
    assert all(t == n for _, t in pools), pools
    assert kernels == n
