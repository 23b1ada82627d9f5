"""``persistent_cache``: the persistent key-value cache of runtime artefacts."""

from .api.persistent_cache import PersistentCache, PersistentCacheOnServer  # noqa: F401
