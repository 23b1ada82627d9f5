"""Host memory for comp nodes: aligned byte buffers and the machine's memory status."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["aligned_empty", "host_mem_status"]


def aligned_empty(nbytes: int, align: int) -> np.ndarray:
    """Allocate an uninitialised 1-d uint8 array whose first byte is ``align``-aligned.

    Parameters
    ----------
    nbytes:
        Size of the buffer in bytes (0 allowed).
    align:
        Required alignment of the start address, a power of two.

    Returns
    -------
    numpy.ndarray
        A view of exactly ``nbytes`` bytes into a slightly larger allocation.
    """
    raw = np.empty(nbytes + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes + 1][:nbytes]  # (an empty slice would keep raw's address)


def _meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields:
                out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def host_mem_status() -> tuple[int, int]:
    """Return ``(total, free)`` bytes of host memory.

    ``free`` is ``MemAvailable`` from ``/proc/meminfo`` (what can be allocated without
    swapping); ``os.sysconf`` is the fallback where ``/proc`` is unavailable.
    """
    try:
        info = _meminfo()
        return info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
