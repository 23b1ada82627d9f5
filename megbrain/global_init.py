"""``global_init``: process-wide state set up when megbrain is imported (logger, cache)."""

from .api.logconf import get_logger
from .api.persistent_cache import PersistentCacheOnServer

#: the process-wide persistent cache
persistent_cache_impl_ins = PersistentCacheOnServer()
PersistentCacheOnServer.reg(persistent_cache_impl_ins)
get_logger()
