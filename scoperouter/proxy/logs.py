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
import threading
import time
from datetime import UTC, datetime
from typing import Any

FIELDS = "fields"  # the `extra` key of structured fields
# One encoder for all lines: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str, check_circular=False)


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **fields}`` on one line.

    Cheap enough for a line per request: the timestamp's text is made once per second."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})
        self._second = -1
        self._prefix = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second, self._prefix = second, stamp
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
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
        return _ENCODER.encode(entry)


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


class BatchingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes lines in batches: one write for up to :data:`BATCH_LINES` lines, at most
    :data:`BATCH_SECONDS` late, warnings and errors at once. A line per request then costs
    its formatting, not a system call (a SIGKILL loses at most the last half second)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._since = 0.0
        flusher = threading.Thread(target=self._flush_regularly, name="log flush", daemon=True)
        flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if not self._pending:
            self._since = time.monotonic()
        self._pending.append(line)
        if len(self._pending) >= BATCH_LINES or record.levelno >= logging.WARNING:
            self._write()

    def _write(self) -> None:
        if self._pending:
            text = "\n".join(self._pending) + "\n"
            self._pending.clear()
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):  # a full disk or a closed stream: drop the lines,
                pass  # never stop the router for its log

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
            super().flush()
        finally:
            self.release()

    def _flush_regularly(self) -> None:
        while True:
            time.sleep(BATCH_SECONDS)
            if self._pending and time.monotonic() - self._since >= BATCH_SECONDS:
                self.flush()


BATCH_LINES = 256
BATCH_SECONDS = 0.5


def setup(level: str, fmt: str, cloud: str | None = None, worker: int | None = None) -> None:
    """Log to stderr in `fmt` ("json" or "text") at `level` (router processes call this first).

    The record attributes nothing here uses are not collected (logging's documented knobs):
    the caller's frame, thread and process names cost more than the line itself."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BatchingHandler(sys.stderr)
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
