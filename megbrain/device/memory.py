"""Host memory for comp nodes: aligned byte buffers and the machine's memory status."""

from __future__ import annotations

import os

from ..kernels.workspace import aligned_empty

__all__ = ["aligned_empty", "host_mem_status"]


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
