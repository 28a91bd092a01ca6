"""Pydantic v2 models of the Open Service Broker API 2.17 bodies.

Requests accept unknown fields (the spec's vendor extension rule: receivers MUST ignore them)
and check types and required fields; a violation becomes a 400 naming the field (api.py).
Responses are rendered with ``exclude_none`` so optional fields are absent, not null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Required, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from scoperouter.broker.contract import CatalogEntry, PlanEntry


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


NonEmpty = Field(min_length=1)

# ------------------------------------------------------------------------------ catalog


class MaintenanceInfo(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    version: str = Field(min_length=1)
    description: str | None = None


class InputParameters(_Response):
    parameters: dict[str, Any]


class InstanceSchemas(_Response):
    create: InputParameters | None = None
    update: InputParameters | None = None


class BindingSchemas(_Response):
    create: InputParameters | None = None


class Schemas(_Response):
    service_instance: InstanceSchemas | None = None
    service_binding: BindingSchemas | None = None


class Plan(_Response):
    id: str
    name: str
    description: str
    metadata: dict[str, Any] | None = None
    free: bool = True
    bindable: bool | None = None
    binding_rotatable: bool | None = None
    plan_updateable: bool | None = None
    schemas: Schemas | None = None
    maximum_polling_duration: int | None = None
    maintenance_info: dict[str, str] | None = None


class ServiceOffering(_Response):
    name: str
    id: str
    description: str
    tags: list[str] | None = None
    requires: list[str] | None = None
    bindable: bool
    instances_retrievable: bool | None = None
    bindings_retrievable: bool | None = None
    allow_context_updates: bool | None = None
    metadata: dict[str, Any] | None = None
    plan_updateable: bool | None = None
    plans: list[Plan] = Field(min_length=1)


class Catalog(_Response):
    services: list[ServiceOffering]


def _input(schema: Mapping[str, Any] | None) -> InputParameters | None:
    return InputParameters(parameters=dict(schema)) if schema is not None else None


def plan_model(entry: CatalogEntry, plan: PlanEntry) -> Plan:
    schemas = plan.schemas
    instance = InstanceSchemas(
        create=_input(schemas.instance_create), update=_input(schemas.instance_update)
    )
    binding = BindingSchemas(create=_input(schemas.binding_create))
    has_instance = instance.create is not None or instance.update is not None
    return Plan(
        id=plan.id,
        name=plan.name,
        description=plan.description,
        metadata=dict(plan.metadata) or None,
        free=plan.free,
        bindable=plan.bindable,
        binding_rotatable=entry.binding_rotatable or None,
        plan_updateable=plan.plan_updateable,
        schemas=Schemas(
            service_instance=instance if has_instance else None,
            service_binding=binding if binding.create is not None else None,
        )
        if has_instance or binding.create is not None
        else None,
        maximum_polling_duration=plan.maximum_polling_duration,
        maintenance_info=dict(plan.maintenance_info) if plan.maintenance_info else None,
    )


def service_model(entry: CatalogEntry) -> ServiceOffering:
    return ServiceOffering(
        name=entry.name,
        id=entry.id,
        description=entry.description,
        tags=list(entry.tags) or None,
        bindable=entry.bindable,
        instances_retrievable=entry.instances_retrievable,
        bindings_retrievable=entry.bindings_retrievable,
        allow_context_updates=entry.allow_context_updates,
        metadata=dict(entry.metadata) or None,
        plan_updateable=entry.plan_updateable,
        plans=[plan_model(entry, plan) for plan in entry.plans],
    )


# ----------------------------------------------------------------------------- requests


class ProvisionRequest(_Request):
    service_id: str = NonEmpty
    plan_id: str = NonEmpty
    context: dict[str, Any] | None = None
    organization_guid: str | None = Field(default=None, min_length=1)
    space_guid: str | None = Field(default=None, min_length=1)
    parameters: dict[str, Any] | None = None
    maintenance_info: MaintenanceInfo | None = None


class PreviousValues(_Request):
    service_id: str | None = None
    plan_id: str | None = None
    organization_id: str | None = None
    space_id: str | None = None
    maintenance_info: MaintenanceInfo | None = None


class UpdateRequest(_Request):
    service_id: str = NonEmpty
    plan_id: str | None = Field(default=None, min_length=1)
    context: dict[str, Any] | None = None
    parameters: dict[str, Any] | None = None
    previous_values: PreviousValues | None = None
    maintenance_info: MaintenanceInfo | None = None


class BindResource(_Request):
    app_guid: str | None = Field(default=None, min_length=1)
    route: str | None = None


class BindRequest(_Request):
    service_id: str = NonEmpty
    plan_id: str = NonEmpty
    context: dict[str, Any] | None = None
    app_guid: str | None = Field(default=None, min_length=1)
    bind_resource: BindResource | None = None
    parameters: dict[str, Any] | None = None
    predecessor_binding_id: str | None = Field(default=None, min_length=1)


# ---------------------------------------------------------------------------- responses


class InstanceMetadata(_Response):
    labels: dict[str, Any] | None = None
    attributes: dict[str, Any] | None = None


class AsyncResponse(_Response):
    """202 of provision/update/deprovision/bind/unbind."""

    operation: str | None = Field(default=None, max_length=10_000)
    dashboard_url: str | None = None
    metadata: InstanceMetadata | None = None


class ProvisionResponse(_Response):
    dashboard_url: str | None = None
    operation: str | None = Field(default=None, max_length=10_000)
    metadata: InstanceMetadata | None = None


class InstanceResponse(_Response):
    """GET /v2/service_instances/:id."""

    service_id: str
    plan_id: str
    dashboard_url: str | None = None
    parameters: dict[str, Any] | None = None
    maintenance_info: dict[str, Any] | None = None
    metadata: InstanceMetadata | None = None


class Endpoint(_Response):
    host: str
    ports: list[str] = Field(min_length=1)
    protocol: Literal["tcp", "udp", "all"] | None = None


class BindingMetadata(_Response):
    expires_at: str | None = None
    renew_before: str | None = None


class BindingResponse(_Response):
    """201/200 of a bind, and GET of a binding."""

    metadata: BindingMetadata | None = None
    credentials: dict[str, Any] | None = None
    endpoints: list[Endpoint] | None = None
    parameters: dict[str, Any] | None = None


class EmptyResponse(_Response):
    """``{}``: a synchronous deprovision/unbind, an update with nothing to change."""


class LastOperation(_Response):
    state: Literal["in progress", "succeeded", "failed"]
    description: str | None = None
    instance_usable: bool | None = None
    update_repeatable: bool | None = None


class LastOperationBody(TypedDict, total=False):
    """:class:`LastOperation` as the polling route writes it, without a model per request
    (the hottest route; tests validate its bodies against :class:`LastOperation`)."""

    state: Required[Literal["in progress", "succeeded", "failed"]]
    description: str
    instance_usable: bool
    update_repeatable: bool


class ErrorBody(_Response):
    error: str | None = None
    description: str | None = None
    instance_usable: bool | None = None
    update_repeatable: bool | None = None
