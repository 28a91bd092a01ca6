"""Router logs: one JSON object per line (or plain text for a terminal), never a secret.

Every record carries ``ts``, ``level``, ``logger``, ``msg`` and the router's ``cloud`` and
``pid``; access-log records add the request's fields (``request_id``, ``method``, ``path``,
``service``, ``cloud``, ``decision``, ``target``, ``status``, ``ms``...). Nothing the router logs
contains a header value, a query string or a body: tokens and passwords travel in those.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any

FIELDS = "fields"  # the `extra` key of structured fields

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **fields}`` on one line."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            **self.static,
            "msg": record.getMessage(),
        }
        fields = record.__dict__.get(FIELDS)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The classic one-line format, with the structured fields as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = record.__dict__.get(FIELDS)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return line


def setup(level: str, fmt: str, cloud: str | None = None, worker: int | None = None) -> None:
    """Log to stderr in `fmt` ("json" or "text") at `level` (router processes call this first)."""
    handler = logging.StreamHandler(sys.stderr)
    static: dict[str, Any] = {"pid": os.getpid()}
    if cloud:
        static["router"] = cloud
    if worker is not None:
        static["worker"] = worker
    handler.setFormatter(JsonFormatter(static) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if logging.getLogger("scoperouter").getEffectiveLevel() >= logging.INFO:
        # One line per request is ours; mitmproxy's connection chatter only with DEBUG.
        logging.getLogger("mitmproxy").setLevel(logging.WARNING)
