"""Name megbrain's compiled (Numba) loops in Linux ``perf``'s profiles.

``perf report`` shows JIT code as bare addresses; it names them from ``/tmp/perf-<pid>.map``
when the profiled process wrote one. :func:`write` writes that map for every function Numba
has compiled or loaded from its cache in this process (the kernels, whose addresses the
executor's worker threads call directly), and can save each function's machine code for
``objdump`` to read the hottest instructions:

    perf record -o perf.data python my_workload.py   # ends with perf_map.write(code_dir=...)
    perf report -i perf.data --sort sym
    perf script -i perf.data -F ip,sym | grep NAME | sort | uniq -c | sort -rn | head
    objdump -D -b binary -mi386:x86-64 --adjust-vma=0xADDR CODE_DIR/ADDR.bin

``perf record -D MS`` leaves out the first MS milliseconds (imports, compiles). A function's
extent is taken up to the next known one, so code of an unnamed neighbour (a C helper) may
be counted to the function before it.
"""

from __future__ import annotations

import gc
import os

__all__ = ["compiled_functions", "write"]


def compiled_functions() -> dict[int, str]:
    """Entry address -> ``module.qualname`` of every compiled overload of every live Numba
    dispatcher (a function of the overload's own module other than its entry point gets
    ``~`` and its symbol appended)."""
    from numba.core.registry import CPUDispatcher

    found: dict[int, str] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, CPUDispatcher):
                continue
        except ReferenceError:  # a dead weak proxy among the objects
            continue
        name = f"{obj.py_func.__module__.rsplit('.', 1)[-1]}.{obj.py_func.__qualname__}"
        for cres in list(obj.overloads.values()):
            lib, entry = cres.library, cres.fndesc.llvm_func_name
            # a library loaded from the cache lists no functions: its entry point only
            symbols = [f.name for f in lib._final_module.functions if not f.is_declaration]
            for sym in symbols or [entry]:
                try:
                    addr = lib.get_pointer_to_function(sym)
                except Exception:  # noqa: BLE001 - a symbol the engine did not emit
                    continue
                if addr:
                    found[addr] = name if sym == entry else f"{name}~{sym[:40]}"
    return found


def write(path: str | None = None, code_dir: str | None = None,
          max_size: int = 1 << 20) -> int:  # fmt: skip
    """Write the perf map of :func:`compiled_functions` (default ``/tmp/perf-<pid>.map``),
    and with ``code_dir`` each function's bytes as ``<address in hex>.bin`` there; returns
    the number of functions. Call it at the end of the profiled run, after the workload."""
    found = compiled_functions()
    addrs = sorted(found)
    path = path or f"/tmp/perf-{os.getpid()}.map"
    if code_dir:
        os.makedirs(code_dir, exist_ok=True)
    with open(path, "w") as f:
        for i, addr in enumerate(addrs):
            size = min(addrs[i + 1] - addr if i + 1 < len(addrs) else max_size, max_size)
            f.write(f"{addr:x} {size:x} {found[addr]}\n")
            if code_dir:
                with open(os.path.join(code_dir, f"{addr:x}.bin"), "wb") as out:
                    out.write(_read_own_memory(addr, size))
    return len(addrs)


def _read_own_memory(addr: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``addr`` on, stopping at the first unmapped page (read
    through ``/proc/self/mem``, which fails there where a pointer read would crash)."""
    out = bytearray()
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        while len(out) < size:
            at = addr + len(out)
            n = min(size - len(out), 4096 - at % 4096)
            try:
                chunk = os.pread(fd, n, at)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    return bytes(out)
