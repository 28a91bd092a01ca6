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
from scoperouter.router.logs import FIELDS
from scoperouter.router.state import HeadRefusal, RequestState, request_id
from scoperouter.routing import Failover, FanOut, Forward

access = logging.getLogger("scoperouter.access")


class Clock(Protocol):
    """Where the access log reads the time: the ``time`` module (a test gives fixed clocks)."""

    def monotonic(self) -> float: ...
    def time(self) -> float: ...


class AccessLog:
    def __init__(self, config: RouterConfig, clock: Clock = time) -> None:
        self.config = config
        self.clock = clock

    def write(self, state: RequestState, status: int, error: str | None = None) -> None:
        if state.logged:
            return
        state.logged = True
        if not access.isEnabledFor(logging.INFO):
            return
        tenths = int((self.clock.monotonic() - state.started) * 10000 + 0.5)  # of a millisecond
        message = f"{state.method} {state.path} {status or '-'}"
        decision = state.decision
        reason = state.message or (decision.message if isinstance(decision, Reject) else None)
        note: tuple[str, str] | None = None
        if reason is not None and status >= 400:
            note = ("reason", _short(reason))
        elif error:
            note = ("error", _short(error))
        direct = logs.direct(access)
        if direct is None:  # the logging machinery: another handler or format is in use
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
            elif isinstance(decision, FanOut | Failover):
                fields["service"] = decision.service_type
                fields["cloud"] = decision.expression
                fields["decision"] = "fanout" if isinstance(decision, FanOut) else "failover"
                if state.tried is not None:
                    fields["tried"] = _short(state.tried, 300)
            else:
                fields["decision"] = "refused"
            if note is not None:
                fields[note[0]] = note[1]
            if state.stripped:
                fields["stripped"] = ",".join(state.stripped)
            access.info("%s", message, extra={FIELDS: fields})
            return
        # The same line as above, as JsonFormatter would write it (a test holds the two equal),
        # rendered in one expression: the line is a sizeable share of a request's work.
        q = logs.quote
        line = (
            f"{direct.start(access.name, self.clock.time())}{q(message)}"
            f',"request_id":{q(state.request_id)},"method":{q(state.method)}'
            f',"path":{q(state.path)},"status":{status or "null"},"ms":{tenths // 10}.{tenths % 10}'
        )
        if isinstance(decision, Forward):
            forward = (
                f',"service":{q(decision.service_type)},"cloud":{q(decision.cloud)}'
                f',"decision":"{"remote" if decision.remote else "local"}"'
                f',"target":{q(decision.url.partition("?")[0])}'
            )
            if note is None and not state.stripped:
                direct.add(f"{line}{forward}}}")  # the usual line: joined once, not added to
                return
            line += forward
        elif isinstance(decision, FanOut | Failover):
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
        if state.stripped:
            line += f',"stripped":{q(",".join(state.stripped))}'
        direct.add(line + "}")

    def refused(self, refusal: HeadRefusal) -> None:
        if not access.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": request_id(None),
            "method": refusal.method,
            "path": refusal.path,
            "status": refusal.status,
            "ms": round((self.clock.monotonic() - refusal.started) * 1000, 1),
            "decision": "refused",
            "reason": _short(refusal.message),
            "client": refusal.client_address,
        }
        access.info(
            "%s %s %s", refusal.method, refusal.path, refusal.status, extra={FIELDS: fields}
        )


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
