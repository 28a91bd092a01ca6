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
import re
import sys
import threading
import time
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, Final

FIELDS = "fields"  # the `extra` key of structured fields
# One encoder for all lines: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, default=str, check_circular=False, separators=(",", ":")
)
_isfinite = math.isfinite
_MILLIS = tuple(f".{n:03d}Z" for n in range(1000))  # a timestamp's end, by its milliseconds
_INFO: Final = logging.INFO
# A lone surrogate: a path or name decoded with surrogateescape (bytes that are not UTF-8).
# json's encoder (ensure_ascii=False) keeps it as it is, and no UTF-8 stream can write it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # re reads the escapes


def as_is(text: str) -> bool:
    """Whether `text` goes between a JSON string's quotes as it is: printable ASCII, neither
    ``"`` nor ``\\`` (most values: a path, a method, a cloud's name). Per character, so the
    concatenation of values is as-is exactly when each value is."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def quote(text: str) -> str:
    """`text` as a JSON string, the text :func:`_encode` writes for it: as it is between
    quotes when :func:`as_is` (no call into json), else by json's C escaper."""
    if as_is(text):
        return f'"{text}"'
    encoded = encode_basestring(text)
    return encoded if text.isascii() else _escape_surrogates(encoded)


def _escape_surrogates(encoded: str) -> str:
    """JSON text with each lone surrogate written as its escape (they are only in strings)."""
    if _SURROGATE.search(encoded) is None:
        return encoded
    return _SURROGATE.sub(_surrogate_escape, encoded)


def _surrogate_escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def _encode(value: Any) -> str:
    """`value` as _ENCODER writes it, except that a lone surrogate is written as its
    ``\\uXXXX`` escape: the line stays valid UTF-8 and decodes to the same value."""
    return _escape_surrogates(_ENCODER.encode(value))


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
    return _encode(value)


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **fields}`` on one line.

    Cheap enough for a line per request (the access log writes one): the line is written as
    text, not built as a dict and encoded. What is the same on every line of a logger (level,
    logger name, the static fields) is encoded once; the timestamp's text once per second;
    field names once each; field values of the common kinds (str, int, None) without json's
    encoder (strings by :func:`quote`). The output is the JSON ``_ENCODER.encode`` makes of
    the same entry, lone surrogates escaped (:func:`_encode`; a test holds it to that)."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})
        # a second and its text (one attribute: a thread logging meanwhile reads one pair)
        self._second_text: tuple[int, str] = (-1, "")
        # (level name, logger name) -> '","level":...,"msg":' (bounded: few of each exist)
        self._heads: dict[tuple[str, str], str] = {}
        self._keys: dict[str, str] = {}  # field name -> ',"name":'
        self._reserved = frozenset({"ts", "level", "logger", "msg", "exc", *self.static})

    def _timestamp(self, created: float) -> str:
        """``2026-01-01T00:00:00.000Z``: the time `created` (seconds), to the millisecond."""
        return self._stamp(int(created * 1000))

    def _stamp(self, millis: int) -> str:
        """The timestamp of `millis` milliseconds since the epoch (what :meth:`_timestamp`
        writes for any time within that millisecond: the text changes at no other clock
        value)."""
        second = millis // 1000
        cached = self._second_text
        if cached[0] != second:
            text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            cached = self._second_text = (second, text)
        return cached[1] + _MILLIS[millis - second * 1000]

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
        head = '",' + _encode(entry)[1:-1] + ',"msg":'
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
        return _encode(entry)


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
        pending = self._pending
        if pending:
            pending.append("")  # the last line's end: one string made, not two
            text = "\n".join(pending)
            pending.clear()
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


BATCH_LINES: Final = 256
BATCH_SECONDS: Final = 0.5


class Direct:
    """Writes lines straight to the JSON handler :func:`setup` installed, for a line per request.

    Only while that handler is the only one that would see the logger's records (a
    :class:`Route` says): the caller then renders the same text :class:`JsonFormatter` would
    (from :meth:`start` on), without the LogRecord and the logging machinery around it, which
    cost more than the line itself."""

    def __init__(self, handler: BatchingHandler, formatter: JsonFormatter) -> None:
        self.handler, self.formatter = handler, formatter
        lock = handler.lock  # Handler.__init__'s (reset in place in a forked child)
        assert lock is not None
        self._lock = lock
        self.root_handlers = logging.getLogger().handlers  # the list itself: kept up to date
        # the last line's millisecond and logger, and its text up to the message
        self._millis, self._logger, self._start = -1, "", ""

    def start(self, logger: str, created: float) -> str:
        """An INFO line's text up to its message: ``{"ts":...,"msg":``. Made once per
        millisecond (per logger), the precision of the line's timestamp."""
        millis = int(created * 1000)
        if millis != self._millis or logger != self._logger:
            formatter = self.formatter
            head = formatter._heads.get(("INFO", logger)) or formatter._head("INFO", logger)
            self._start = '{"ts":"' + formatter._stamp(millis) + head
            self._millis, self._logger = millis, logger
        return self._start

    def sole(self) -> bool:
        """Whether the handler is still the root's only one, without a filter (a test's
        capturing handler, added at any time, sees the records again)."""
        handlers = self.root_handlers
        return len(handlers) == 1 and handlers[0] is self.handler and not self.handler.filters

    def add(self, line: str) -> None:
        lock = self._lock
        lock.acquire()  # not `with`: two calls, where the compiled `with` makes three
        try:
            self.handler.add(line)
        finally:
            lock.release()


def _plain(logger: logging.Logger) -> bool:
    """No handler or filter between `logger` and the root: only the root's handlers see it."""
    node: logging.Logger | None = logger
    while node is not None and node.parent is not None:
        if node.handlers or node.filters or not node.propagate:
            return False
        node = node.parent
    return True


_direct: Direct | None = None


class Route:
    """Where a logger's INFO lines go: nowhere (INFO is not enabled), the :class:`Direct`
    writer, or the logging machinery (a test's capturing handler, a filter, the text
    format...). Resolved again when logging changed, not per line: a level set anywhere or
    :func:`logging.disable` (logging then forgets its cached answer for the logger, this
    compares the answer it caches again with its own), :func:`setup` run again, the logger
    disabled; a handler or filter added to the logger or a parent (not the root) is seen at
    the next resolution. Whether the handler is still the root's only one is checked per line
    (a capturing handler can be added at any time; the check costs less than a call)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.name = logger.name
        self.enabled = False  # INFO is (as of the last resolution)
        self._direct: Direct | None = None  # the writer, when the logger's lines may go there
        self._setup: Direct | None = None  # setup's writer when resolved
        # logging's own cache of the logger's answers by level (CPython's Logger._cache,
        # cleared at every level change); None: not there, resolve at every line
        self._levels: dict[int, bool] | None = None

    def writer(self) -> Direct | None:
        """The Direct writer for this line, or None: log it the usual way when
        :attr:`enabled`, else not at all."""
        levels = self._levels
        if (
            levels is None
            or levels.get(_INFO) is not self.enabled
            or self._setup is not _direct
            or self.logger.disabled
        ):
            self._resolve()
        direct = self._direct
        return direct if direct is not None and direct.sole() else None

    def _resolve(self) -> None:
        logger = self.logger
        self.enabled = logger.isEnabledFor(_INFO)
        levels = getattr(logger, "_cache", None)
        self._levels = levels if isinstance(levels, dict) else None
        writer = self._setup = _direct
        plain = writer is not None and self.enabled and _plain(logger)
        self._direct = writer if plain else None


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
