"""AccessLog: one structured line per request the router answers, with its request id.

Written once per request, when its answer is known (:meth:`AccessLog.write`: the pipeline's
last step, whatever the answer), and once per head refused before the pipeline saw a request
(:meth:`AccessLog.refused`). The request id (``X-Scope-Request-Id``, passed to the
next router and returned to the client) ties the lines of every router a request crossed.
Fields never include a header value, a query string or a body (where tokens travel); the names
of identity fields a client forged and the router dropped are one (``stripped``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from scoperouter.errors import Reject
from scoperouter.router import logs
from scoperouter.router.config import RouterConfig
from scoperouter.router.logs import FIELDS, as_is, quote
from scoperouter.router.state import HeadRefusal, RequestState, request_id
from scoperouter.routing import Combined, Failover, FanOut, Forward

access = logging.getLogger("scoperouter.access")


class Clock(Protocol):
    """Where the access log reads the time: the ``time`` module (a test gives fixed clocks)."""

    def monotonic(self) -> float: ...
    def time(self) -> float: ...


class AccessLog:
    def __init__(self, config: RouterConfig, clock: Clock = time) -> None:
        self.config = config
        self._monotonic = clock.monotonic
        self._time = clock.time
        self._route = logs.Route(access)  # resolved when logging changes, not per line

    def write(self, state: RequestState, status: int, error: str | None = None) -> None:
        if state.logged:
            return
        state.logged = True
        route = self._route
        direct = route.writer()
        if direct is None:
            if route.enabled:  # another handler or format is in use: the logging machinery
                self._log(state, status, error)
            return
        # The line JsonFormatter would write for _log's record (a test holds the two equal),
        # rendered in one expression: the line is a sizeable share of a request's work.
        tenths = int((self._monotonic() - state.started) * 10000 + 0.5)  # of a millisecond
        start = direct.start(route.name, self._time())
        method, path, request = state.method, state.path, state.request_id
        decision, reason, stripped = state.decision, state.message, state.stripped
        if isinstance(decision, Forward) and not reason and not error and not stripped:
            # the usual line: nothing to escape in it (when its values are as_is), one string
            url = decision.url
            cut = url.find("?")
            target = url if cut < 0 else url[:cut]
            service, cloud = decision.service_type, decision.cloud
            if as_is(f"{method}{path}{request}{service}{cloud}{target}"):  # no escaping
                direct.add(
                    f'{start}"{method} {path} {status or "-"}","request_id":"{request}"'
                    f',"method":"{method}","path":"{path}","status":{status or "null"}'
                    f',"ms":{tenths // 10}.{tenths % 10},"service":"{service}"'
                    f',"cloud":"{cloud}","decision":"{"remote" if decision.remote else "local"}"'
                    f',"target":"{target}"}}'
                )
                return
        q = quote
        message = f"{method} {path} {status or '-'}"
        note = _note(decision, reason, status, error)
        line = (
            f"{start}{q(message)}"
            f',"request_id":{q(request)},"method":{q(method)}'
            f',"path":{q(path)},"status":{status or "null"},"ms":{tenths // 10}.{tenths % 10}'
        )
        if isinstance(decision, Forward):
            line += (
                f',"service":{q(decision.service_type)},"cloud":{q(decision.cloud)}'
                f',"decision":"{"remote" if decision.remote else "local"}"'
                f',"target":{q(decision.url.partition("?")[0])}'
            )
        elif isinstance(decision, (FanOut, Failover)):
            line += (
                f',"service":{q(decision.service_type)},"cloud":{q(decision.expression)}'
                f',"decision":"{"fanout" if isinstance(decision, FanOut) else "failover"}"'
            )
            if state.tried is not None:
                line += f',"tried":{q(_short(state.tried, 300))}'
        else:
            line += ',"decision":"refused"'
        if note is not None:
            line += f',"{note[0]}":{q(note[1])}'
        if stripped:
            line += f',"stripped":{q(",".join(stripped))}'
        direct.add(line + "}")

    def _log(self, state: RequestState, status: int, error: str | None) -> None:
        """The line through the logging machinery: a record with the fields."""
        tenths = int((self._monotonic() - state.started) * 10000 + 0.5)
        decision = state.decision
        fields: dict[str, Any] = {
            "request_id": state.request_id,
            "method": state.method,
            "path": state.path,
            "status": status or None,
            "ms": tenths / 10,
        }
        if isinstance(decision, Forward):
            fields["service"] = decision.service_type
            fields["cloud"] = decision.cloud
            fields["decision"] = "remote" if decision.remote else "local"
            fields["target"] = decision.url.partition("?")[0]
        elif isinstance(decision, (FanOut, Failover)):
            fields["service"] = decision.service_type
            fields["cloud"] = decision.expression
            fields["decision"] = "fanout" if isinstance(decision, FanOut) else "failover"
            if state.tried is not None:
                fields["tried"] = _short(state.tried, 300)
        else:
            fields["decision"] = "refused"
        note = _note(decision, state.message, status, error)
        if note is not None:
            fields[note[0]] = note[1]
        if state.stripped:
            fields["stripped"] = ",".join(state.stripped)
        message = f"{state.method} {state.path} {status or '-'}"
        access.info("%s", message, extra={FIELDS: fields})

    def refused(self, refusal: HeadRefusal) -> None:
        if not access.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": request_id(None),
            "method": refusal.method,
            "path": refusal.path,
            "status": refusal.status,
            "ms": round((self._monotonic() - refusal.started) * 1000, 1),
            "decision": "refused",
            "reason": _short(refusal.message),
            "client": refusal.client_address,
        }
        access.info(
            "%s %s %s", refusal.method, refusal.path, refusal.status, extra={FIELDS: fields}
        )


def _note(
    decision: Forward | Reject | Combined | None,
    message: str | None,
    status: int,
    error: str | None,
) -> tuple[str, str] | None:
    """The line's ``reason`` (why the router refused, for a status >= 400) or ``error``."""
    reason = message or (decision.message if isinstance(decision, Reject) else None)
    if reason is not None and status >= 400:
        return ("reason", _short(reason))
    if error:
        return ("error", _short(error))
    return None


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
