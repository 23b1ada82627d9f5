"""Compiled functions get symbol ids no two processes share (kernels/numba_names.py): with
Numba's own counter, two processes compiling the same kernels in the same order name them
alike, and kernels of one qualname cached by different processes collided when loaded."""

from __future__ import annotations

import subprocess
import sys

from numba.core.bytecode import FunctionIdentity

import megbrain.kernels  # noqa: F401 - installs the random ids

_SNIPPET = """
import megbrain.kernels
from numba import njit
def make(k):
    def f(x):
        return x + k
    return f
f = njit(make(1))
f(1)
print(f.overloads[f.signatures[0]].fndesc.mangled_name)
"""


def _mangled_in_fresh_process() -> str:
    out = subprocess.run([sys.executable, "-c", _SNIPPET], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.strip()


def test_two_processes_name_the_same_kernel_apart():
    first, second = _mangled_in_fresh_process(), _mangled_in_fresh_process()
    assert "make" in first
    assert first != second


def test_ids_are_not_a_count():
    ids = [next(FunctionIdentity._unique_ids) for _ in range(4)]
    assert len(set(ids)) == 4
    assert any(b - a != 1 for a, b in zip(ids, ids[1:]))
