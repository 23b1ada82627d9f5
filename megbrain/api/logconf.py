"""The ``megbrain`` logger: a coloured formatter on stderr, or a logger the user hands over."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["get_logger", "set_logger", "MgbLogFormatter"]

_LOGGER_NAME = "megbrain"
_replaced_logger: logging.Logger | None = None


class MgbLogFormatter(logging.Formatter):
    """``[mgb] time LEVEL message``, the level coloured when stderr is a terminal."""

    _COLORS = {
        logging.WARNING: "\x1b[1;33m",
        logging.ERROR: "\x1b[1;31m",
        logging.DEBUG: "\x1b[36m",
    }

    def format(self, record: logging.LogRecord) -> str:
        head = f"[mgb] {self.formatTime(record, '%H:%M:%S')} {record.levelname}"
        color = self._COLORS.get(record.levelno) if sys.stderr.isatty() else None
        if color:
            head = f"{color}{head}\x1b[0m"
        return f"{head} {record.getMessage()}"


def get_logger() -> logging.Logger:
    """The logger megbrain writes to (``MGB_LOGLEVEL`` = DEBUG/INFO/WARNING/ERROR sets its
    level when megbrain installs its own handler)."""
    if _replaced_logger is not None:
        return _replaced_logger
    logger = logging.getLogger(_LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(MgbLogFormatter())
        logger.addHandler(handler)
        logger.propagate = False
        level = os.environ.get("MGB_LOGLEVEL", "WARNING").upper()
        logger.setLevel(getattr(logging, level, logging.WARNING))
    return logger


def set_logger(logger: logging.Logger) -> None:
    """Route megbrain's log records to ``logger`` from now on (also those of its passes)."""
    global _replaced_logger
    if not isinstance(logger, logging.Logger):
        raise TypeError(f"set_logger: expected a logging.Logger, got {type(logger).__name__}")
    _replaced_logger = logger
    own = logging.getLogger(_LOGGER_NAME)
    if logger is own:  # the user configured megbrain's own logger: nothing to forward
        return
    for h in list(own.handlers):
        own.removeHandler(h)
    own.propagate = False
    own.addHandler(_Forward(logger))


class _Forward(logging.Handler):
    def __init__(self, target: logging.Logger):
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        if self.target.isEnabledFor(record.levelno):
            self.target.handle(record)
