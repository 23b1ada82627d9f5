"""``logconf``: the ``megbrain`` logger (``get_logger``, ``set_logger``)."""

from .api.logconf import MgbLogFormatter, get_logger, set_logger  # noqa: F401
