"""OpenBLAS's idle workers stop spinning soon after a threaded call once megbrain's kernel
threads are in use (they would otherwise share a core with those threads for ~0.1 s)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("threadpoolctl")

_PROBE = textwrap.dedent(
    """
    import ctypes, time
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits
    libs = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    if not libs:
        print("no-openblas")
        raise SystemExit
    threadpool_limits(2)
    from megbrain.kernels import parallel
    quieted = parallel.quiet_blas_workers()
    lib = ctypes.CDLL(libs[0]["filepath"])
    lib.openblas_thread_timeout.restype = ctypes.c_int
    a = np.random.default_rng(0).random((512, 512)).astype(np.float32)
    ok = bool(np.allclose(a @ a, a.astype(np.float64) @ a, rtol=1e-4))
    a @ a
    cpu = time.process_time()
    time.sleep(0.05)
    spin_ms = (time.process_time() - cpu) * 1e3
    print(quieted, lib.openblas_thread_timeout(), ok, round(spin_ms, 1))
    """
)


def _probe(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if out == ["no-openblas"]:
        pytest.skip("NumPy's BLAS is not OpenBLAS")
    return out


def test_workers_of_an_already_loaded_openblas_stop_spinning():
    from megbrain.kernels.parallel import BLAS_SPIN_LOG2_CYCLES

    quieted, timeout, ok, spin_ms = _probe({})
    assert quieted == "True"
    assert int(timeout) == BLAS_SPIN_LOG2_CYCLES
    assert ok == "True"  # threaded GEMMs still run, restarted workers and all
    # OpenBLAS's default spin keeps a worker busy through the whole 50 ms sleep
    assert float(spin_ms) < 25.0


def test_the_users_own_timeout_is_left_alone():
    quieted, timeout, ok, _ = _probe({"OPENBLAS_THREAD_TIMEOUT": "26"})
    assert quieted == "False"
    assert int(timeout) == 26
    assert ok == "True"
