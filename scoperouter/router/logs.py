"""Router logs: one JSON object per line (or plain text for a terminal), never a secret.

Every record carries ``ts``, ``level``, ``logger``, ``msg`` and the router's ``cloud`` and
``pid``; access-log records add the request's fields (``request_id``, ``method``, ``path``,
``service``, ``cloud``, ``decision``, ``target``, ``status``, ``ms``...). Nothing the router logs
contains a header value, a query string or a body: tokens and passwords travel in those.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

FIELDS = "fields"  # the `extra` key of structured fields
# One encoder for all lines: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, default=str, check_circular=False, separators=(",", ":")
)
# A JSON string, quoted and escaped, as _ENCODER writes it (non-ASCII kept): json's C function.
quote: Callable[[str], str] = encode_basestring
_isfinite = math.isfinite
_MILLIS = tuple(f".{n:03d}Z" for n in range(1000))  # a timestamp's end, by its milliseconds


def _json_value(value: Any) -> str:
    """`value` as _ENCODER would write it; strings and integers (most fields) without it."""
    kind = type(value)
    if kind is str:
        return quote(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and _isfinite(value):
        return float.__repr__(value)  # json's own choice for a finite float
    if value is None:
        return "null"
    return _ENCODER.encode(value)


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **fields}`` on one line.

    Cheap enough for a line per request (the access log writes one): the line is written as
    text, not built as a dict and encoded. What is the same on every line of a logger (level,
    logger name, the static fields) is encoded once; the timestamp's text once per second;
    field names once each; field values of the common kinds (str, int, None) by json's C
    string escaper. The output is the JSON ``_ENCODER.encode`` makes of the same entry (a test
    holds it to that)."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})
        self._second = -1
        self._prefix = ""
        # (level name, logger name) -> '","level":...,"msg":' (bounded: few of each exist)
        self._heads: dict[tuple[str, str], str] = {}
        self._keys: dict[str, str] = {}  # field name -> ',"name":'
        self._reserved = frozenset({"ts", "level", "logger", "msg", "exc", *self.static})

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second, self._prefix = second, stamp
        return self._prefix + _MILLIS[min(int((created - second) * 1000), 999)]

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] | None = record.__dict__.get(FIELDS)
        if record.exc_info or (fields and not self._reserved.isdisjoint(fields)):
            return self._format_entry(record, fields)
        level, logger = record.levelname, record.name
        head = self._heads.get((level, logger)) or self._head(level, logger)
        parts = ['{"ts":"', self._timestamp(record.created), head, quote(record.getMessage())]
        if fields:
            keys, add = self._keys, parts.append
            for name, value in fields.items():
                add(keys.get(name) or self._key(name))
                add(quote(value) if type(value) is str else _json_value(value))
        parts.append("}")
        return "".join(parts)

    def _head(self, level: str, logger: str) -> str:
        """The encoded text between the timestamp and the message, for this level and logger
        (cached: few of each exist)."""
        entry = {"level": level, "logger": logger, **self.static}
        head = '",' + _ENCODER.encode(entry)[1:-1] + ',"msg":'
        if len(self._heads) < 256:
            self._heads[(level, logger)] = head
        return head

    def _key(self, name: str) -> str:
        key = "," + quote(name) + ":"
        if len(self._keys) < 1024:
            self._keys[name] = key
        return key

    def _format_entry(self, record: logging.LogRecord, fields: dict[str, Any] | None) -> str:
        """The general case (an exception, a field named like a base key): as a dict."""
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            **self.static,
            "msg": record.getMessage(),
        }
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
        self.add(line, record.levelno >= logging.WARNING)

    def add(self, line: str, urgent: bool = False) -> None:
        """Queue a formatted line (the caller holds the handler's lock); `urgent`: write now."""
        if not self._pending:
            self._since = time.monotonic()
        self._pending.append(line)
        if urgent or len(self._pending) >= BATCH_LINES:
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


class Direct:
    """Writes lines straight to the JSON handler :func:`setup` installed, for a line per request.

    Only while that handler is the only one that would see the logger's records (:func:`direct`
    says): the caller then renders the same text :class:`JsonFormatter` would (from
    :meth:`start` on), without the LogRecord and the logging machinery around it, which cost
    more than the line itself."""

    def __init__(self, handler: BatchingHandler, formatter: JsonFormatter) -> None:
        self.handler, self.formatter = handler, formatter
        self.root_handlers = logging.getLogger().handlers  # the list itself: kept up to date
        # logger name -> no handler or filter on its way up (checked once per logger)
        self.plain: dict[str, bool] = {}
        # the current second's '{"ts":"YYYY-MM-DDTHH:MM:SS' and the text after the time
        self._second, self._logger, self._prefix, self._head = -1, "", "", ""

    def start(self, logger: str, created: float) -> str:
        """An INFO line's text up to its message: ``{"ts":...,"msg":``."""
        second = int(created)
        if second != self._second or logger != self._logger:  # once a second (per logger)
            formatter = self.formatter
            head = formatter._heads.get(("INFO", logger)) or formatter._head("INFO", logger)
            self._second, self._logger, self._head = second, logger, head
            self._prefix = '{"ts":"' + formatter._timestamp(second)[:-5]  # less ".mmmZ"
        return self._prefix + _MILLIS[min(int((created - second) * 1000), 999)] + self._head

    def add(self, line: str) -> None:
        handler = self.handler
        with handler.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            handler.add(line)


def _plain(logger: logging.Logger) -> bool:
    """No handler or filter between `logger` and the root: only the root's handlers see it."""
    node: logging.Logger | None = logger
    while node is not None and node.parent is not None:
        if node.handlers or node.filters or not node.propagate:
            return False
        node = node.parent
    return True


_direct: Direct | None = None


def direct(logger: logging.Logger) -> Direct | None:
    """The :class:`Direct` writer for `logger`'s lines, or None: log them the usual way (a
    test's capturing handler, a filter, the text format...)."""
    writer = _direct
    if writer is None:
        return None
    handlers = writer.root_handlers
    if len(handlers) != 1 or handlers[0] is not writer.handler or writer.handler.filters:
        return None
    plain = writer.plain.get(logger.name)
    if plain is None:
        plain = writer.plain[logger.name] = _plain(logger)
    return writer if plain else None


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
    formatter = JsonFormatter(static) if fmt == "json" else TextFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    global _direct
    _direct = Direct(handler, formatter) if isinstance(formatter, JsonFormatter) else None
    root.setLevel(level)
    if logging.getLogger("scoperouter").getEffectiveLevel() >= logging.INFO:
        # One line per request is ours; mitmproxy's connection chatter only with DEBUG.
        logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    # mitmproxy's addon package imports passlib (for an addon the router does not load), which
    # warns with a traceback about the bcrypt version it finds: harmless, and alarming.
    logging.getLogger("passlib").setLevel(logging.ERROR)
