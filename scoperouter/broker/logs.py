"""Log lines that carry the request identity.

The platform's ``X-Broker-API-Request-Identity`` is put in a context variable for the duration
of the request (api.py) and of every worker pass of the operations it started (worker.py); a
logging filter copies it into every record, so every line logged while serving a request
(including openstacksdk's and keystoneauth's) names the request it belongs to.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator

request_identity: contextvars.ContextVar[str] = contextvars.ContextVar(
    "scoperouter_broker_request_identity", default="-"
)

FORMAT = "%(asctime)s %(levelname)s %(name)s [request %(request_id)s] %(message)s"


class RequestIdentityFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_identity.get()
        return True


@contextlib.contextmanager
def identity(value: str | None) -> Iterator[None]:
    token = request_identity.set(value or "-")
    try:
        yield
    finally:
        request_identity.reset(token)


def setup_logging(level: str = "INFO", stream: object = None) -> None:
    """Root logging for `scoperouter broker serve`: one format, the request identity on
    every line (the filter sits on the handler, so records of every logger get it)."""
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(RequestIdentityFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # keystoneauth logs request bodies at DEBUG, with secrets: never below INFO
    for noisy in ("keystoneauth", "openstack", "urllib3", "stevedore"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLevelName(level)))


def short_error(exc: BaseException) -> str:
    """An exception as one short line (type and first line of its text) for descriptions and
    logs: never a traceback, and at most 300 characters of what a library put in it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text[:300]}" if text else name


# how much of a client's value an error description (or a log line) quotes
EXCERPT_CHARS = 64


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A value from a request as an error quotes it: its first `limit` characters, control
    characters (and lone surrogates, which UTF-8 cannot encode) as ``?``, and ``…`` when it
    was longer. Never a client's value at length (a 3,000-character ``service_id`` was echoed
    whole), never a line break in a log."""
    text = value if isinstance(value, str) else str(value)
    shown = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return shown + "…" if len(text) > limit else shown
