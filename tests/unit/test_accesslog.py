"""The access line as a router writes it: logging set up by ``logs.setup`` (JSON, batched, on
stderr), the line written straight to its handler, and every change made to logging after the
first line (a level, ``logging.disable``, a new setup, a handler added) taking effect at the
next one. (Its equality with the logging machinery's line, whatever the request sent:
tests/unit/test_router.py.)"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator

from scoperouter.router import logs
from scoperouter.router.accesslog import AccessLog, access
from scoperouter.router.logs import FIELDS
from scoperouter.router.state import RequestState
from scoperouter.routing import Forward

# A line the direct writer wrote starts with the fixed clock's time (the logging machinery's
# record has the real one).
DIRECT = '{"ts":"2023-11-14T22:13:20.500Z"'


class _Clock:
    def monotonic(self) -> float:
        return 1000.0125

    def time(self) -> float:
        return 1_700_000_000.5


def _state(path: str = "/v2/images") -> RequestState:
    state = RequestState(request_id="req-1", headers={}, method="GET", path=path, started=1000.0)
    state.decision = Forward(
        cloud="CloudTwo",
        service_type="image",
        interface="public",
        remote=True,
        url=f"http://127.0.0.3:9292{path}?limit=1",
    )
    return state


@contextlib.contextmanager
def _router_logging() -> Iterator[io.StringIO]:
    """A StringIO for stderr, where ``logs.setup`` logs; stderr and logging as they were,
    afterwards (within the test's call: pytest's own handlers and capture are the phase's)."""
    root = logging.getLogger()
    stderr = sys.stderr
    others = {name: logging.getLogger(name).level for name in ("mitmproxy", "passlib")}
    saved = (root.handlers[:], root.level, logs._direct, access.level, access.disabled)
    knobs = (logging._srcfile, logging.logThreads, logging.logProcesses)
    knobs += (logging.logMultiprocessing, root.manager.disable)
    stream = sys.stderr = io.StringIO()
    try:
        yield stream
    finally:
        sys.stderr = stderr
        root.handlers[:], _, logs._direct, _, access.disabled = saved
        root.setLevel(saved[1])
        access.setLevel(saved[3])
        logging._srcfile, logging.logThreads, logging.logProcesses = knobs[:3]
        logging.logMultiprocessing = knobs[3]
        logging.disable(knobs[4])
        for name, level in others.items():
            logging.getLogger(name).setLevel(level)


def _written(stream: io.StringIO) -> list[str]:
    for handler in logging.getLogger().handlers:
        handler.flush()
    return stream.getvalue().splitlines()


def _paths(lines: list[str]) -> list[str]:
    return [json.loads(line)["path"] for line in lines]


def test_the_usual_line_is_written_as_the_json_formatter_writes_it() -> None:
    with _router_logging() as stderr:
        logs.setup("INFO", "json", "CloudOne", worker=0)
        AccessLog(None, _Clock()).write(_state(), 200)  # type: ignore[arg-type]
        assert _written(stderr) == [
            f'{DIRECT},"level":"INFO","logger":"scoperouter.access","pid":{os.getpid()},'
            '"router":"CloudOne","worker":0,"msg":"GET /v2/images 200","request_id":"req-1",'
            '"method":"GET","path":"/v2/images","status":200,"ms":12.5,"service":"image",'
            '"cloud":"CloudTwo","decision":"remote","target":"http://127.0.0.3:9292/v2/images"}'
        ]


def test_level_changes_after_the_first_line_take_effect_at_the_next() -> None:
    with _router_logging() as stderr:
        logs.setup("INFO", "json", "CloudOne", worker=0)
        log = AccessLog(None, _Clock())  # type: ignore[arg-type]
        root = logging.getLogger()

        def count() -> int:
            log.write(_state(), 200)
            return len(_written(stderr))

        assert count() == 1
        access.setLevel(logging.WARNING)
        # logging's cache answered again by another caller before the next line: still not INFO
        assert not access.isEnabledFor(logging.INFO)
        assert count() == 1
        access.setLevel(logging.NOTSET)
        assert count() == 2
        root.setLevel(logging.WARNING)
        assert count() == 2
        root.setLevel(logging.INFO)
        assert count() == 3
        logging.disable(logging.INFO)
        assert count() == 3
        logging.disable(logging.NOTSET)
        assert count() == 4
        access.disabled = True
        assert count() == 4
        access.disabled = False
        assert count() == 5
        assert all(line.startswith(DIRECT) for line in _written(stderr))


def test_a_new_setup_takes_the_next_line() -> None:
    with _router_logging() as stderr:
        logs.setup("INFO", "json", "CloudOne", worker=0)
        first = logging.getLogger().handlers[0]
        log = AccessLog(None, _Clock())  # type: ignore[arg-type]
        log.write(_state("/one"), 200)
        streams = [io.StringIO() for _ in range(3)]
        sys.stderr = streams[0]
        logs.setup("INFO", "json", "CloudOne", worker=1)
        log.write(_state("/two"), 200)
        first.flush()
        assert _paths(stderr.getvalue().splitlines()) == ["/one"]
        [line] = _written(streams[0])
        assert line.startswith(DIRECT) and json.loads(line)["worker"] == 1
        sys.stderr = streams[1]
        logs.setup("WARNING", "json", "CloudOne")
        log.write(_state("/three"), 200)
        assert _written(streams[1]) == []
        sys.stderr = streams[2]
        logs.setup("INFO", "text", "CloudOne")
        log.write(_state("/four"), 200)
        [line] = _written(streams[2])
        assert "INFO scoperouter.access: GET /four 200 request_id=req-1" in line


def test_a_writer_put_in_place_without_a_level_change_is_used() -> None:
    with _router_logging():
        logs.setup("INFO", "json", "CloudOne", worker=0)
        log = AccessLog(None, _Clock())  # type: ignore[arg-type]
        log.write(_state("/one"), 200)
        old = logs._direct
        assert old is not None
        stream = io.StringIO()
        handler = logs.BatchingHandler(stream)
        handler.setFormatter(old.formatter)
        logging.getLogger().handlers[:] = [handler]
        logs._direct = logs.Direct(handler, old.formatter)
        log.write(_state("/two"), 200)
        handler.flush()
        [line] = stream.getvalue().splitlines()
        assert line.startswith(DIRECT) and json.loads(line)["path"] == "/two"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_handler_added_after_the_first_line_sees_the_next() -> None:
    with _router_logging() as stderr:
        logs.setup("INFO", "json", "CloudOne", worker=0)
        log = AccessLog(None, _Clock())  # type: ignore[arg-type]
        root = logging.getLogger()
        log.write(_state("/one"), 200)
        capture = _Capture()
        root.addHandler(capture)  # as pytest's caplog does
        log.write(_state("/two"), 200)
        root.removeHandler(capture)
        log.write(_state("/three"), 200)
        root.handlers[0].addFilter(lambda record: True)
        log.write(_state("/four"), 200)
        lines = _written(stderr)
        assert _paths(lines) == ["/one", "/two", "/three", "/four"]
        assert [line.startswith(DIRECT) for line in lines] == [True, False, True, False]
        assert [r.__dict__[FIELDS]["path"] for r in capture.records] == ["/two"]
        root.handlers[0].filters.clear()
        access.addHandler(capture)  # on the logger itself: seen at the next level change
        try:
            access.setLevel(logging.INFO)
            log.write(_state("/five"), 200)
        finally:
            access.removeHandler(capture)
        assert [r.__dict__[FIELDS]["path"] for r in capture.records] == ["/two", "/five"]
        assert not _written(stderr)[-1].startswith(DIRECT)
