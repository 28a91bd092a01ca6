"""``bench.kills``'s platform: what Cloud Foundry does with a broker (asynchronous requests,
``last_operation`` polled, a request whose connection failed sent again to the next broker)."""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.kills_verdict import OpResult, PlatformBinding, PlatformView
from scoperouter.broker.osbclient import Answer, OSBClient
from scoperouter.broker.tables import IN_PROGRESS
from tests.broker import fakes

with warnings.catch_warnings():  # the tests' conftest imports FastAPI's TestClient (unused
    warnings.simplefilter("ignore")  # here), whose module warns about httpx
    from tests.broker.conftest import PASSWORD

S, P = fakes.SERVICE_ID, fakes.PLAN_ID
POLL_MAX = 0.5  # the platform polls at most this far apart (Retry-After is honoured below it)


class PlatformGaveUp(RuntimeError):
    pass


@dataclass
class InFlight:
    """What the kill thread may know of the operation the platform is running."""

    answered: threading.Event = field(default_factory=threading.Event)
    operation: str | None = None
    target: int = 0  # the broker (index) the request was last sent to


class Platform:
    """What Cloud Foundry does with a broker: async requests, ``last_operation`` polled, a
    request whose connection failed sent again (to the next broker: a load balancer)."""

    def __init__(self, urls: list[str], timeout: float) -> None:
        self.clients = [OSBClient(u, "broker", PASSWORD, timeout=30) for u in urls]
        self.turn = 0
        self.timeout = timeout
        self.view = PlatformView()

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def _call(self, flight: InFlight, name: str, *args: Any, **kwargs: Any) -> Answer:
        end = time.monotonic() + self.timeout
        while True:
            index = self.turn % len(self.clients)
            flight.target = index
            try:
                return getattr(self.clients[index], name)(*args, **kwargs)  # type: ignore[no-any-return]
            except httpx.TransportError:
                if time.monotonic() > end:
                    raise PlatformGaveUp(f"{name}: no broker answered") from None
                self.turn += 1
                time.sleep(0.2)

    def _poll(self, flight: InFlight, instance: str, binding: str | None) -> tuple[str, str]:
        end = time.monotonic() + self.timeout
        while True:
            answer = self._call(flight, "last_operation", instance, flight.operation, binding)
            if answer.status == 410:
                return "gone", ""
            if answer.status != 200 or not isinstance(answer.body, dict):
                return "error", f"last_operation answered {answer.status}: {answer.body}"
            state = str(answer.body.get("state"))
            if state != IN_PROGRESS:
                return state, str(answer.body.get("description", ""))
            if time.monotonic() > end:
                return "timeout", str(answer.body.get("description", ""))
            try:
                delay = float(answer.headers.get("retry-after", "1"))
            except ValueError:
                delay = 1.0
            time.sleep(max(0.05, min(delay, POLL_MAX)))

    def run(self, kind: str, spec: dict[str, Any], flight: InFlight) -> OpResult:
        instance, binding = spec["instance"], spec.get("binding")
        started = time.monotonic()
        result = OpResult(kind, instance, binding, None, "error")
        try:
            result.state, result.description = self._run(kind, spec, flight)
        except PlatformGaveUp as exc:
            result.state, result.description = "timeout", str(exc)
        result.operation = flight.operation
        result.seconds = round(time.monotonic() - started, 2)
        return result

    def _run(self, kind: str, spec: dict[str, Any], flight: InFlight) -> tuple[str, str]:
        instance, binding = str(spec["instance"]), str(spec.get("binding", ""))
        params = spec.get("parameters")
        view = self.view
        if kind == "provision":
            answer = self._call(flight, "provision", instance, S, P, params)
        elif kind == "update":
            answer = self._call(flight, "update", instance, S, None, params)
        elif kind == "bind":
            answer = self._call(flight, "bind", instance, binding, S, P, params)
        elif kind == "unbind":
            answer = self._call(flight, "unbind", instance, binding, S, P)
        else:
            answer = self._call(flight, "deprovision", instance, S, P)
        flight.operation = answer.operation
        flight.answered.set()
        if answer.status == 202:
            state, description = self._poll(
                flight, instance, binding if kind in ("bind", "unbind") else None
            )
        elif answer.status in (200, 201):
            state, description = "succeeded", "answered at once"
        elif answer.status == 410 and kind in ("unbind", "deprovision"):
            state, description = "gone", ""
        else:
            return "error", f"{kind} answered {answer.status}: {answer.body}"
        done = state == "succeeded" or (state == "gone" and kind in ("unbind", "deprovision"))
        if kind == "provision" and state in ("succeeded", "failed"):
            view.instances[instance] = True  # a failed one exists until the platform deletes it
        elif kind == "bind" and state == "succeeded":
            creds = answer.body.get("credentials") if answer.status in (200, 201) else None
            if creds is None:
                got = self._call(flight, "get_binding", instance, binding)
                creds = got.body.get("credentials") if isinstance(got.body, dict) else None
            password = creds.get("password") if isinstance(creds, dict) else None
            view.bindings[binding] = PlatformBinding(instance, True, password)
        elif kind == "bind" and state == "failed":
            view.bindings[binding] = PlatformBinding(instance, True, None)
        elif kind == "unbind" and done:
            view.bindings[binding].exists = False
        elif kind == "deprovision" and done:
            view.instances[instance] = False
            for b in view.bindings.values():
                if b.instance_id == instance:
                    b.exists = False
        return state, description
