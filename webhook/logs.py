"""Structured logging: one JSON object per line on stderr.

Contract: :func:`configure_logging` makes every ``logging`` record a JSON line with
``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, the fields passed as
``extra={"fields": {...}}``, and ``traceback`` when an exception is attached.
:func:`log_fields` logs such a line. Values that JSON cannot hold are rendered with
``str``. Nothing here ever raises into the caller.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON (see the module contract)."""
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            line.update(fields)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def configure_logging(level: str = "info") -> None:
    """Send all logging to stderr as JSON lines at ``level`` (debug, info, warning...)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def log_fields(
    logger: logging.Logger, message: str, fields: Mapping[str, Any], level: int = logging.INFO
) -> None:
    """Log ``message`` with ``fields`` merged into its JSON line."""
    logger.log(level, message, extra={"fields": dict(fields)})
