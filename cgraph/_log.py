"""cgraph's logger: INFO on stderr by default, the user's settings once they have any.

A library should not configure logging, yet a user who runs
``CGRAPH_VISUALIZE_SCHEDULE=1 python train.py`` expects to see where the picture
went. So the "cgraph" logger gets:

- one stderr handler that speaks only while the program has configured no
  logging at all (the root logger has no handlers);
- a default level just below INFO (``_DEFAULT_LEVEL``, 19), so INFO passes;
  while it is still that default and the user has configured logging, a
  filter applies the root logger's level instead, so ``basicConfig()`` at
  WARNING hides cgraph's INFO as it hides everyone's. Any level the user sets
  on "cgraph" (INFO included, e.g. ``caplog.set_level(INFO, logger="cgraph")``)
  is taken as is.

Modules log through ``logging.getLogger("cgraph")`` (this ``logger``).
"""

from __future__ import annotations

import logging
import sys

_DEFAULT_LEVEL = logging.INFO - 1  # INFO passes; tells our default from a user's INFO


class _UnconfiguredOnly(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to stderr only while the root logger has no handlers."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            self.stream = sys.stderr  # the current one (tests and tools swap it)
            super().emit(record)


class _RespectUserLevel(logging.Filter):
    """With logging configured and cgraph's level untouched, use the root's level."""

    def filter(self, record: logging.LogRecord) -> bool:
        root = logging.getLogger()
        if root.handlers and logger.level == _DEFAULT_LEVEL:
            return record.levelno >= root.getEffectiveLevel()
        return True


def _make_logger() -> logging.Logger:
    log = logging.getLogger("cgraph")
    if not any(isinstance(h, _UnconfiguredOnly) for h in log.handlers):
        handler = _UnconfiguredOnly(sys.stderr)
        handler.setFormatter(logging.Formatter("[cgraph] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.addFilter(_RespectUserLevel())
    if log.level == logging.NOTSET:
        log.setLevel(_DEFAULT_LEVEL)
    return log


logger = _make_logger()
"""The "cgraph" logger."""
