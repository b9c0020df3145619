"""The operator process's log: one stderr handler, at a level, as text lines or JSON objects."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal, TextIO

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]

LEVELS: dict[LogLevel, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# kopf's own text layout (its `--log-format full`), which the operator has always printed.
TEXT_FORMAT = "[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s"
# The attribute kopf's per-object loggers put on a record: the resource the line is about.
_OBJECT_REFERENCE = "k8s_ref"
_OBJECT_KEYS = ("apiVersion", "kind", "namespace", "name", "uid")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the resource, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (never a line break inside: tracebacks are escaped)."""
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        reference = getattr(record, _OBJECT_REFERENCE, None)
        if isinstance(reference, dict):
            entry["object"] = {k: reference[k] for k in _OBJECT_KEYS if reference.get(k)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class _OperatorLogHandler(logging.StreamHandler[TextIO]):
    """The handler configure_logging installs (a second call replaces it, not adds one)."""


def configure_logging(
    level: LogLevel, log_format: LogFormat, stream: TextIO | None = None
) -> logging.Handler:
    """Send every logger's records at or above level to stream in log_format (asyncio's: debug)."""
    handler = _OperatorLogHandler(stream)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _OperatorLogHandler)]
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    # Without propagation and without a handler, logging's last resort would print them anyway.
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.propagate = level == "debug"
    asyncio_logger.handlers[:] = [] if level == "debug" else [logging.NullHandler()]
    return handler
