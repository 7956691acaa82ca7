"""Logging configuration for Aphrodite-KDA (loguru-free variant of the upstream logger)."""
import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
APHRODITE_LOG_LEVEL = os.environ.get("APHRODITE_LOG_LEVEL", "WARNING")

_root = logging.getLogger("aphro_kda")
if not _root.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    _root.addHandler(_handler)
    _root.setLevel(APHRODITE_LOG_LEVEL)
    _root.propagate = False


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("aphro_kda") else f"aphro_kda.{name}")
