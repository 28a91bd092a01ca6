"""An OSB client that sends what Cloud Foundry sends (tests, benchmarks, operators' smoke
checks).

Every request carries ``X-Broker-API-Version`` (2.17 by default; Cloud Foundry sends 2.15 and
later), basic auth, a fresh ``X-Broker-API-Request-Identity`` (a UUID) and, for requests a user
caused, ``X-Broker-API-Originating-Identity: cloudfoundry <base64 {"user_id": ...}>``;
provision and bind bodies carry the CF ``context`` object (platform, organization and space
GUIDs and names, instance name) and the deprecated top-level ``organization_guid`` /
``space_guid``, as CF does. Answers are returned as they come (status, body, headers): the
client does not hide the broker's errors, since checking them is what it is for.

    from scoperouter.broker.osbclient import OSBClient

    with OSBClient("http://127.0.0.1:8090", "broker", password) as osb:
        service = osb.catalog().body["services"][0]
        plan = service["plans"][0]
        answer = osb.provision("my-instance", service["id"], plan["id"], {"cloud": "CloudTwo"})
        osb.wait("my-instance", answer.body["operation"])
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from scoperouter.broker.contract import JSONValue

CF_CONTEXT = {
    "platform": "cloudfoundry",
    "organization_guid": "00000000-0000-4000-8000-00000000000a",
    "organization_name": "scoperouter-org",
    "space_guid": "00000000-0000-4000-8000-00000000000b",
    "space_name": "scoperouter-space",
}


@dataclass(frozen=True)
class Answer:
    status: int
    body: JSONValue  # the answer's JSON (its text when not JSON; None: empty)
    headers: Mapping[str, str]
    request_identity: str

    @property
    def operation(self) -> str | None:
        return self.body.get("operation") if isinstance(self.body, dict) else None


class OSBError(RuntimeError):
    pass


class OSBClient:
    def __init__(
        self,
        url: str,
        username: str,
        password: str,
        *,
        api_version: str = "2.17",
        user_id: str | None = "osb-client-user",
        context: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.api_version = api_version
        self.user_id = user_id
        self.context = dict(context or CF_CONTEXT)
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            auth=(username, password),
            timeout=timeout,
            transport=transport,
            headers={"X-Broker-API-Version": api_version},
        )

    def __enter__(self) -> OSBClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # ----------------------------------------------------------------------------- wire

    def originating_identity(self) -> str | None:
        if self.user_id is None:
            return None
        value = base64.b64encode(json.dumps({"user_id": self.user_id}).encode()).decode()
        return f"{self.context.get('platform', 'cloudfoundry')} {value}"

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        user_action: bool = True,
    ) -> Answer:
        request_id = str(uuid.uuid4())
        headers = {"X-Broker-API-Request-Identity": request_id}
        identity = self.originating_identity() if user_action else None
        if identity:
            headers["X-Broker-API-Originating-Identity"] = identity
        response = self.http.request(method, path, params=params, json=body, headers=headers)
        try:
            data = response.json() if response.content else None
        except ValueError:
            data = response.text
        return Answer(response.status_code, data, response.headers, request_id)

    # ------------------------------------------------------------------------ endpoints

    def catalog(self) -> Answer:
        return self.request("GET", "/v2/catalog", user_action=False)

    def _instance_body(
        self, service_id: str, plan_id: str, parameters: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "service_id": service_id,
            "plan_id": plan_id,
            "context": {**self.context},
            "organization_guid": self.context.get("organization_guid"),
            "space_guid": self.context.get("space_guid"),
        }
        if parameters is not None:
            body["parameters"] = parameters
        return body

    def provision(
        self,
        instance_id: str,
        service_id: str,
        plan_id: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        accepts_incomplete: bool = True,
        maintenance_info: Mapping[str, str] | None = None,
    ) -> Answer:
        body = self._instance_body(service_id, plan_id, parameters)
        body["context"]["instance_name"] = instance_id
        if maintenance_info:
            body["maintenance_info"] = dict(maintenance_info)
        return self.request(
            "PUT",
            f"/v2/service_instances/{instance_id}",
            params={"accepts_incomplete": str(accepts_incomplete).lower()},
            body=body,
        )

    def update(
        self,
        instance_id: str,
        service_id: str,
        plan_id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        *,
        accepts_incomplete: bool = True,
    ) -> Answer:
        body: dict[str, Any] = {"service_id": service_id, "context": {**self.context}}
        if plan_id:
            body["plan_id"] = plan_id
        if parameters is not None:
            body["parameters"] = dict(parameters)
        return self.request(
            "PATCH",
            f"/v2/service_instances/{instance_id}",
            params={"accepts_incomplete": str(accepts_incomplete).lower()},
            body=body,
        )

    def deprovision(
        self, instance_id: str, service_id: str, plan_id: str, *, accepts_incomplete: bool = True
    ) -> Answer:
        return self.request(
            "DELETE",
            f"/v2/service_instances/{instance_id}",
            params={
                "service_id": service_id,
                "plan_id": plan_id,
                "accepts_incomplete": str(accepts_incomplete).lower(),
            },
        )

    def get_instance(self, instance_id: str) -> Answer:
        return self.request("GET", f"/v2/service_instances/{instance_id}")

    def last_operation(
        self, instance_id: str, operation: str | None = None, binding_id: str | None = None
    ) -> Answer:
        path = f"/v2/service_instances/{instance_id}"
        if binding_id:
            path += f"/service_bindings/{binding_id}"
        params = {"operation": operation} if operation else None
        return self.request("GET", path + "/last_operation", params=params, user_action=False)

    def bind(
        self,
        instance_id: str,
        binding_id: str,
        service_id: str,
        plan_id: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        accepts_incomplete: bool = True,
        predecessor_binding_id: str | None = None,
        app_guid: str = "00000000-0000-4000-8000-00000000000c",
    ) -> Answer:
        body: dict[str, Any] = {
            "service_id": service_id,
            "plan_id": plan_id,
            "context": {**self.context},
            "app_guid": app_guid,
            "bind_resource": {"app_guid": app_guid},
        }
        if parameters is not None:
            body["parameters"] = dict(parameters)
        if predecessor_binding_id:
            body["predecessor_binding_id"] = predecessor_binding_id
        params = {"accepts_incomplete": "true"} if accepts_incomplete else None
        return self.request(
            "PUT",
            f"/v2/service_instances/{instance_id}/service_bindings/{binding_id}",
            params=params,
            body=body,
        )

    def unbind(
        self,
        instance_id: str,
        binding_id: str,
        service_id: str,
        plan_id: str,
        *,
        accepts_incomplete: bool = True,
    ) -> Answer:
        params = {"service_id": service_id, "plan_id": plan_id}
        if accepts_incomplete:
            params["accepts_incomplete"] = "true"
        return self.request(
            "DELETE",
            f"/v2/service_instances/{instance_id}/service_bindings/{binding_id}",
            params=params,
        )

    def get_binding(self, instance_id: str, binding_id: str) -> Answer:
        return self.request(
            "GET", f"/v2/service_instances/{instance_id}/service_bindings/{binding_id}"
        )

    # -------------------------------------------------------------------------- polling

    def wait(
        self,
        instance_id: str,
        operation: str | None,
        *,
        binding_id: str | None = None,
        timeout: float = 300.0,
        max_interval: float = 5.0,
    ) -> Answer:
        """Poll last_operation as a platform does (honouring Retry-After, capped at
        `max_interval`) until the state is final or the resource is gone (410); returns the
        last answer. Raises OSBError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            answer = self.last_operation(instance_id, operation, binding_id)
            if answer.status == 410:
                return answer
            if answer.status != 200:
                raise OSBError(f"last_operation answered {answer.status}: {answer.body}")
            if answer.body.get("state") != "in progress":
                return answer
            if time.monotonic() > end:
                raise OSBError(f"operation {operation} still in progress after {timeout:.0f}s")
            try:
                delay = float(answer.headers.get("retry-after", "1"))
            except ValueError:
                delay = 1.0
            time.sleep(max(0.05, min(delay, max_interval, end - time.monotonic())))
