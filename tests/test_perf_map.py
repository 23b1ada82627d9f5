"""benchmarks/perf_map.py: the perf map names a compiled kernel at its entry point, and the
saved machine code is that function's own bytes."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")  # fmt: skip


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="Linux's /proc only")
def test_the_map_names_a_compiled_kernel_and_saves_its_code(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import perf_map

    from megbrain.kernels.conv.loops import winograd

    finput = winograd.compiled()[1]
    x = np.zeros((1, 1, 4, 4), np.float32)
    finput(x, np.zeros(64, np.float32), np.zeros(100, np.float32), 0, 1, 1, 2, 0, 2, 4, 0)
    cres = next(iter(finput.overloads.values()))
    entry = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    path = tmp_path / "perf.map"
    n = perf_map.write(str(path), code_dir=str(tmp_path / "code"))
    rows = {int(a, 16): (int(s, 16), name) for a, s, name in
            (line.split(" ", 2) for line in path.read_text().splitlines())}  # fmt: skip
    assert n == len(rows) and rows[entry][1].strip() == "winograd._input_py"
    code = (tmp_path / "code" / f"{entry:x}.bin").read_bytes()
    assert 0 < len(code) <= rows[entry][0]
    assert code[:64] == ctypes.string_at(entry, 64)
