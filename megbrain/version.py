"""``version``: the runtime's version (``Version``, ``version_info``, ``__version__``)."""

from .api.version import Version, __version__, version_info  # noqa: F401
