"""Router log lines: JSON objects (or text), written in batches, warnings at once."""

from __future__ import annotations

import io
import json
import logging
import time
from json.encoder import encode_basestring

from hypothesis import given, settings
from hypothesis import strategies as st

from scoperouter.router.logs import (
    FIELDS,
    BatchingHandler,
    Direct,
    JsonFormatter,
    TextFormatter,
    as_is,
    quote,
)

# Text as a surrogateescape-decoded path or name carries bytes that are not UTF-8: lone
# surrogates (st.text() never makes them).
_SURROGATE_ESCAPED = st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))
_TEXT = st.text() | _SURROGATE_ESCAPED
# One handler for the Direct writers of the tests that need one (each starts a flush thread).
_HANDLER = BatchingHandler(io.StringIO())


def record(level: int = logging.INFO, **fields: object) -> logging.LogRecord:
    extra = {FIELDS: fields} if fields else None
    return logging.getLogger("scoperouter.access").makeRecord(
        "scoperouter.access", level, "", 0, "GET %s %s", ("/v2/images", 200), None, extra=extra
    )


def test_json_line_has_the_fields_and_one_line_only() -> None:
    line = JsonFormatter({"router": "CloudOne", "pid": 7}).format(
        record(request_id="req-1", path="/v2/images", status=200, note="two\nlines")
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["msg"] == "GET /v2/images 200" and entry["level"] == "INFO"
    assert entry["logger"] == "scoperouter.access" and entry["router"] == "CloudOne"
    assert entry["request_id"] == "req-1" and entry["note"] == "two\nlines"
    assert entry["ts"].endswith("Z") and len(entry["ts"]) == len("2026-01-01T00:00:00.000Z")


def test_exceptions_are_in_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record(logging.ERROR)
        rec.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in entry["exc"]


def test_text_lines_show_the_fields() -> None:
    line = TextFormatter().format(record(status=200, cloud="CloudTwo", reason=None))
    assert "GET /v2/images 200" in line and "status=200 cloud=CloudTwo" in line
    assert "reason" not in line


def test_lines_are_written_in_batches_and_warnings_at_once() -> None:
    stream = io.StringIO()
    handler = BatchingHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.handle(record())
    handler.handle(record())
    assert stream.getvalue() == ""  # not yet: batched
    handler.handle(record(logging.WARNING))
    assert stream.getvalue().count("\n") == 3  # a warning writes the batch, itself included
    handler.handle(record())
    deadline = time.monotonic() + 3
    while stream.getvalue().count("\n") < 4:  # the flusher thread writes it within a second
        assert time.monotonic() < deadline
        time.sleep(0.05)
    handler.handle(record())
    handler.flush()
    assert stream.getvalue().count("\n") == 5


def test_a_broken_stream_never_breaks_the_caller() -> None:
    stream = io.StringIO()
    handler = BatchingHandler(stream)
    handler.setFormatter(JsonFormatter())
    stream.close()
    handler.handle(record(logging.ERROR))  # no exception
    handler.flush()


_VALUES = (
    _TEXT
    | st.integers()
    | st.floats()
    | st.booleans()
    | st.none()
    | st.lists(st.integers(), max_size=3)
    | st.lists(_SURROGATE_ESCAPED, max_size=2)
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(["request_id", "path", "status", "ms", "msg", "router", "x", "é"])
        | st.text(max_size=8)
        | _SURROGATE_ESCAPED,
        _VALUES,
        max_size=8,
    ),
    message=st.text(max_size=20) | _SURROGATE_ESCAPED,
    logger=st.sampled_from(["scoperouter.access", "scoperouter", 'a"b\\c', "a\udcffb"]),
)
def test_json_lines_are_what_the_encoder_makes_of_the_entry(
    fields: dict[str, object], message: str, logger: str
) -> None:
    """The formatter writes lines as text (cheap); each must be the JSON that encoding the
    whole entry as a dict gives: same text, so same keys, values, order and escapes."""
    formatter = JsonFormatter({"router": "CloudOne", "pid": 7})
    rec = logging.getLogger(logger).makeRecord(
        logger, logging.INFO, "", 0, "%s", (message,), None, extra={FIELDS: fields}
    )
    line = formatter.format(rec)
    assert line == formatter._format_entry(rec, fields)
    assert formatter.format(rec) == line  # the cached parts give the same line again
    assert "\n" not in line
    line.encode("utf-8")  # strict: lone surrogates are escaped


@settings(max_examples=500, deadline=None)
@given(text=_TEXT | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_quote_writes_jsons_string_and_escapes_lone_surrogates(text: str) -> None:
    """quote: json's own text for a string (printable ASCII without a quote or backslash as
    it is, between quotes); a lone surrogate, which json keeps and no UTF-8 stream can write,
    as its \\uXXXX escape: the same string once decoded."""
    quoted = quote(text)
    assert json.loads(quoted) == text
    quoted.encode("utf-8")  # strict
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        assert quoted == encode_basestring(text)
    assert as_is(text) == all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in text)
    if as_is(text):
        assert quoted == f'"{text}"'
    if any(c in '"\\' or ord(c) < 0x20 for c in text):
        assert quoted != f'"{text}"'


def test_lone_surrogates_are_escaped_in_every_part_of_a_line() -> None:
    path = b"/v2/\xff\xfe".decode("utf-8", "surrogateescape")
    assert quote(path) == '"/v2/\\udcff\\udcfe"' and quote("é\udcff") == '"é\\udcff"'
    line = JsonFormatter({"router": "Cloud\udce9"}).format(record(path=path, tags=[path]))
    assert "\\udcff\\udcfe" in line and '"router":"Cloud\\udce9"' in line
    entry = json.loads(line.encode("utf-8"))
    assert entry["path"] == path and entry["tags"] == [path]


def test_timestamps_keep_three_digits_of_milliseconds_at_a_seconds_edge() -> None:
    formatter = JsonFormatter()
    for created in (
        1_700_000_000.0,
        1_700_000_000.0005,
        1_700_000_000.9999999,
        1_700_000_001 - 1e-7,
    ):
        stamp = formatter._timestamp(created)
        assert len(stamp) == len("2023-11-14T22:13:20.000Z") and stamp.endswith("Z"), stamp
    assert formatter._timestamp(1_700_000_000.25).endswith(":20.250Z")


def test_the_direct_writers_line_start_is_the_formatters_across_seconds_and_loggers() -> None:
    """Direct.start keeps the second's text and the logger's part between two calls (the
    access line's writer): what it gives is always the formatter's own text, whatever the
    time does (a new second, an edge, backwards) and whichever logger asks."""
    formatter = JsonFormatter({"router": "CloudOne", "pid": 7})
    direct = Direct(_HANDLER, formatter)
    times = [1_700_000_000.25, 1_700_000_000.9999999, 1_700_000_001.0004, 1_700_000_001 - 1e-7]
    times += [1_700_000_061.5, 1_600_000_000.125, 1_700_000_061.5]
    times += [1_700_000_061.5004, 1_700_000_061.5011, 1_700_000_061.5011, 1_700_000_061.5009]
    for created in times:
        for logger in ("scoperouter.access", "scoperouter", "scoperouter.access"):
            expected = formatter._timestamp(created) + formatter._head("INFO", logger)
            assert direct.start(logger, created) == '{"ts":"' + expected, (logger, created)
    # kept for the millisecond it was made for, not the second
    assert direct.start("scoperouter", 1_700_000_061.5011).startswith(
        '{"ts":"2023-11-14T22:14:21.501Z"'
    )
    assert direct.start("scoperouter", 1_700_000_061.5029).startswith(
        '{"ts":"2023-11-14T22:14:21.502Z"'
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False), min_size=1))
def test_the_direct_writers_timestamp_is_the_formatters_at_any_time(times: list[float]) -> None:
    """Whatever times follow each other (same millisecond, next one, backwards, edges),
    Direct.start's cached text is the formatter's for that time."""
    formatter = JsonFormatter()
    direct = Direct(_HANDLER, formatter)
    for created in times:
        for near in (created, created + 1e-4, created + 1e-3, created - 1e-4):
            expected = '{"ts":"' + formatter._timestamp(near) + formatter._head("INFO", "x")
            assert direct.start("x", near) == expected
