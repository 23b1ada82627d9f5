"""A persistent key-value cache for runtime artefacts (algorithm choices, compiled kernels).

``PersistentCache`` is the interface (``put``/``get`` of bytes under a category); the default
implementation keeps them in a ``shelve`` file under ``$MGB_PERSISTENT_CACHE_DIR`` (default
``~/.cache/megbrain/persistent_cache``), keyed by user and megbrain version so that a new
version never reads another's entries. When the directory can not be used it falls back to
memory.
"""

from __future__ import annotations

import getpass
import os
import shelve
import threading

from ..kernels.conv import registry as conv_algos
from .version import __version__

__all__ = ["PersistentCache", "PersistentCacheOnServer", "default_cache_dir"]


def default_cache_dir() -> str:
    """The persistent cache directory: ``$MGB_PERSISTENT_CACHE_DIR``, else
    ``~/.cache/megbrain/persistent_cache``."""
    return os.environ.get("MGB_PERSISTENT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "megbrain", "persistent_cache"
    )


class PersistentCache:
    """Interface of a persistent cache: subclasses implement ``put`` and ``get``."""

    @staticmethod
    def reg(cache: PersistentCache | None) -> None:
        """Make ``cache`` the process-wide persistent cache (as the reference's
        ``_PersistentCache.reg``): the PROFILE convolution strategies keep their algorithm
        choices there (category ``conv_algo``). None keeps them in memory only."""
        conv_algos.set_persistent_cache(cache)

    def put(self, category: str, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def get(self, category: str, key: bytes) -> bytes | None:
        raise NotImplementedError


class PersistentCacheOnServer(PersistentCache):
    """The default cache: a shelve file (the reference kept a Redis server or this file)."""

    def __init__(self, cache_dir: str | None = None):
        self._dir = cache_dir
        self._store = None
        self._lock = threading.Lock()

    @staticmethod
    def make_user_prefix() -> str:
        try:
            user = getpass.getuser()
        except Exception:  # no user name in some containers
            user = str(os.getuid())
        return f"mgbcache:{user}"

    def _make_key(self, category: str, key: bytes | str) -> str:
        if isinstance(key, bytes):
            key = key.hex()
        return f"{self.make_user_prefix()}:MGB{__version__}@{category}@{key}"

    def _conn(self):
        if self._store is None:
            try:
                d = self._dir or default_cache_dir()
                os.makedirs(d, exist_ok=True)
                self._store = shelve.open(os.path.join(d, "cache"))
            except OSError:
                self._store = {}
        return self._store

    def put(self, category: str, key: bytes, value: bytes) -> None:
        with self._lock:
            store = self._conn()
            store[self._make_key(category, key)] = bytes(value)
            if hasattr(store, "sync"):
                store.sync()

    def get(self, category: str, key: bytes) -> bytes | None:
        with self._lock:
            return self._conn().get(self._make_key(category, key))

    def close(self) -> None:
        with self._lock:
            if hasattr(self._store, "close"):
                self._store.close()
            self._store = None
