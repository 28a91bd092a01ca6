"""The contract between the broker and its services (docs/broker.md, "The service contract").

A service is a plug-in: a :class:`Service` subclass registered under the entry point group
``scoperouter.broker.services`` (``openstack-server = scoperouter.broker.services.server:
ServerService``). The broker's API layer reads its :meth:`Service.catalog` and validates
requests with the plans' JSON schemas; the worker calls the operation methods with an
:class:`OperationContext` and records the :data:`Outcome`.

Why passes that return an outcome, rather than one call that does everything: a provision can
take minutes (a server booting) and the broker can be killed at any point. Each call is one
*pass* of "look at what exists, do the next step": it must be safe to run again from the start
(every resource tagged with the instance or binding id and looked up before it is created),
save what it learnt with :meth:`OperationContext.save`, and return ``Pending`` to be called
again later by any worker of any replica. Nothing waits in a pass for longer than a request to a
cloud takes.

This module holds data and interfaces only: no I/O, no framework imports.
"""

from __future__ import annotations

import abc
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    from openstack.connection import Connection

    from scoperouter.broker.identity import Identity

ENTRY_POINT_GROUP = "scoperouter.broker.services"

# The JSON-schema draft the built-in services write their plans' parameter schemas in (OSB
# requires a ``$schema`` key naming a draft, 04 or later).
DRAFT4 = "http://json-schema.org/draft-04/schema#"
# Namespace of the built-in offerings' catalog ids (uuid5 of the names): never change it.
CATALOG_NAMESPACE = uuid.UUID("5c0de0b5-0000-4000-8000-000000000001")


def stable_id(*parts: str) -> str:
    """A catalog id (service, plan) derived from names, the same in every release and every
    replica: OSB ids are immutable, and a platform that registered the broker keeps them."""
    return str(uuid.uuid5(CATALOG_NAMESPACE, "/".join(parts)))


OperationKind = Literal["provision", "update", "deprovision", "bind", "unbind"]
JSONSchema = Mapping[str, Any]
JSONValue = Any
"""A JSON value of any shape: what a JSON column, a request's parameters or a YAML file hold.
The broker's `Any` stands only here and as the values of str-keyed JSON objects
(``dict[str, Any]``, ``Mapping[str, Any]``); tests/unit/test_broker_types.py keeps it so."""


# ------------------------------------------------------------------------------ catalog


@dataclass(frozen=True, kw_only=True)
class Schemas:
    """JSON schemas (with ``$schema``) of a plan's parameters; None: no parameters accepted."""

    instance_create: JSONSchema | None = None
    instance_update: JSONSchema | None = None
    binding_create: JSONSchema | None = None


@dataclass(frozen=True, kw_only=True)
class PlanEntry:
    """One plan of a service's catalog entry. `settings` are the service's own (e.g. the flavor
    of a server plan), from the broker config; they are not shown to platforms."""

    id: str
    name: str
    description: str
    free: bool = True
    bindable: bool | None = None
    plan_updateable: bool | None = None
    schemas: Schemas = field(default_factory=Schemas)
    maintenance_info: Mapping[str, str] | None = None  # {"version": semver, "description"}
    maximum_polling_duration: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """A service offering, as ``GET /v2/catalog`` lists it (models.py renders the OSB JSON)."""

    id: str
    name: str
    description: str
    plans: tuple[PlanEntry, ...]
    bindable: bool = True
    plan_updateable: bool = False
    instances_retrievable: bool = True
    bindings_retrievable: bool = True
    allow_context_updates: bool = False
    binding_rotatable: bool = False
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Done:
    """The operation succeeded. `result`: for a bind, ``{"credentials": {...}}`` and
    optionally ``"endpoints"`` (OSB endpoint objects), ``"expires_at"`` and ``"renew_before"``
    (datetimes or ISO 8601 text): the worker stores the credentials encrypted and the platform
    gets them in the bind response (credentials.py builds this mapping). A result without a
    ``"credentials"`` key is taken as the credentials themselves. Otherwise: unused."""

    description: str
    result: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Pending:
    """Not finished: call again after `retry_after` seconds (from any worker)."""

    description: str
    retry_after: float = 2.0


@dataclass(frozen=True, slots=True)
class Failed:
    """The operation cannot succeed; `description` says why, for humans (last_operation)."""

    description: str


Outcome = Done | Pending | Failed


class InvalidParameters(ValueError):
    """A request's parameters are wrong beyond what the JSON schema says: 400 naming `field`."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


class LeaseLost(RuntimeError):
    """Another worker owns the operation now (this one was too slow to renew): stop the pass."""


# --------------------------------------------------------------------------- the clouds


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one cloud can still take, read through its router (placement inventories minus
    usages, allocation ratio and reserved applied), per resource class."""

    cloud: str
    total: Mapping[str, float]  # e.g. {"VCPU": 64, "MEMORY_MB": 131072, "DISK_GB": 2000}
    free: Mapping[str, float]
    read_at: datetime
    # Per resource class, the most ONE allocation can take from any single provider: the
    # largest min(max_unit, free) over the providers. A flavor asking more than this cannot
    # land anywhere in the cloud however much is free in total (e.g. 16 VCPU free spread over
    # hosts whose max_unit is 8). None: unknown (no check).
    largest: Mapping[str, float] | None = None


class Clouds(Protocol):
    """The federation as the broker reaches it: every call goes through a cloud's router."""

    def names(self) -> tuple[str, ...]:
        """The federation's clouds the broker has credentials for, in config order."""
        ...

    def connect(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> Connection:
        """An openstacksdk Connection entering the federation at `cloud` (its router), as the
        broker's account, scoped to `project_id` (else the account's own project), with the
        routing scope `scope` (JSON text) when given."""
        ...

    def capacity(self, cloud: str) -> Capacity:
        """The cloud's free capacity (cached for a few seconds); raises when unreadable."""
        ...

    def identity_url(self, cloud: str) -> str:
        """The public identity URL of `cloud` (its router frontend): what bindings point at."""
        ...

    def region(self, cloud: str) -> str:
        """The keystone region of `cloud` (clouds.yaml `region_name` of a binding)."""
        ...

    def session_entry(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> dict[str, Any]:
        """A clouds.yaml entry for a tool the broker runs (a playbook): a token of the
        broker's account scoped to `project_id` in `cloud`, at the cloud's router, with the
        routing scope `scope` (JSON text) when given. The token is a secret."""
        ...

    def endpoints(
        self, cloud: str, *, project_id: str | None = None, scope: str | None = None
    ) -> dict[str, str]:
        """The public endpoint of each service type in the catalog that connection sees
        (the routers' URLs, the project substituted: ``{"object-store":
        "http://.../v1/AUTH_<project>"}``), for a tool that must name one."""
        ...


# ------------------------------------------------------------------- what a pass can see


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    service_id: str
    plan_id: str
    parameters: Mapping[str, Any]
    context: Mapping[str, Any]
    cloud: str | None
    resources: Mapping[str, Any]
    service_name: str = ""  # the service's name in the broker config ("openstack-server")


# Another instance of the broker by id, provisioned (None: no such live instance): what
# Service.check_references may look at.
InstanceLookup = Callable[[str], "InstanceView | None"]


@dataclass(frozen=True, slots=True)
class BindingView:
    id: str
    instance_id: str
    parameters: Mapping[str, Any]
    context: Mapping[str, Any]
    predecessor_binding_id: str | None
    resources: Mapping[str, Any]


class OperationContext(abc.ABC):
    """What the worker gives a service for one pass of one operation."""

    operation_id: str
    kind: OperationKind
    instance: InstanceView  # as stored: for an update, the values before it
    binding: BindingView | None
    plan: PlanEntry  # for an update, the target plan
    # what this operation works with: the instance's parameters and context (for an update,
    # the new ones, already merged), or the binding's (bind/unbind)
    parameters: Mapping[str, Any]
    context: Mapping[str, Any]
    originating_identity: Mapping[str, Any] | None  # {"platform": ..., "value": {...}}
    request_identity: str | None  # X-Broker-API-Request-Identity of the request
    deadline: datetime
    clouds: Clouds
    # keystone projects and roles the broker manages, with the config's identity table
    # (space projects, instance projects, grants to mapped platform users)
    identity: Identity
    log: logging.LoggerAdapter[logging.Logger]

    @property
    @abc.abstractmethod
    def progress(self) -> Mapping[str, Any]:
        """What earlier passes of this operation saved."""

    @property
    @abc.abstractmethod
    def cancelled(self) -> bool:
        """A DELETE arrived for the instance (binding) while this provision (bind) ran: stop
        building and return (any outcome: the operation is recorded as stopped)."""

    @property
    def stopping(self) -> bool:
        """The pass should end now: :attr:`cancelled`, or this worker lost the operation's
        lease (another owns it; its outcome would be dropped). For a pass that runs long."""
        return self.cancelled

    @abc.abstractmethod
    def save(self, **progress: JSONValue) -> None:
        """Merge `progress` into the operation's saved progress and commit it now (so a pass
        that dies after this line does not redo the step). Raises LeaseLost."""

    @abc.abstractmethod
    def set_cloud(self, cloud: str) -> None:
        """Record the cloud the instance lives in (shown in GET and metadata); commits."""

    @abc.abstractmethod
    def set_resources(self, **ids: JSONValue) -> None:
        """Merge OpenStack ids into the instance's (or, for bind/unbind, the binding's)
        resources; commits. E.g. ``set_resources(project_id=..., server_id=...)``."""

    def describe(self, text: str) -> None:
        """Show `text` as the operation's description (``last_operation``) while the pass
        runs: for a pass that takes long (a playbook, task by task). Best effort; commits."""
        return None

    @property
    def secrets(self) -> Mapping[str, Any]:
        """What earlier operations of the instance kept with :meth:`keep_secrets` (decrypted;
        never shown in GET, metadata or logs)."""
        return {}

    def instance_of(self, instance_id: str) -> InstanceView | None:
        """Another instance of the broker, provisioned (None: no such live instance): what a
        parameter naming one (a volume's server) refers to now."""
        return None

    def keep_secrets(self, **values: JSONValue) -> None:
        """Merge `values` into the instance's secrets, stored encrypted (a key pair's private
        key that only its creation returns, for later binds); commits. A value None removes
        its key."""
        raise NotImplementedError(f"{type(self).__name__} keeps no secrets")


# ------------------------------------------------------------------------- the service


@dataclass(frozen=True, slots=True)
class Found:
    """A resource in a cloud that carries this broker's tag (for ``broker repair``)."""

    cloud: str
    kind: str  # "server", "project", "image", "application_credential"
    id: str
    instance_id: str | None
    binding_id: str | None = None
    name: str | None = None


class Service(abc.ABC):
    """A broker service. Subclasses set `name` and implement the passes; `settings` is the
    service's section of the broker config (plans included), `clouds` the federation."""

    name: ClassVar[str]

    def __init__(self, settings: Mapping[str, Any], clouds: Clouds) -> None:
        self.settings = settings
        self.clouds = clouds

    @abc.abstractmethod
    def catalog(self) -> CatalogEntry:
        """The offering: plans, schemas, flags. Must not call any cloud (the catalog is
        served while clouds are down)."""

    def validate(self, kind: OperationKind, plan: PlanEntry, parameters: Mapping[str, Any]) -> None:
        """Checks beyond the plan's JSON schema (which the API applies first); raise
        InvalidParameters. Must not call any cloud. The default accepts what the schema
        accepts."""
        return None

    def check_references(
        self,
        kind: OperationKind,
        plan: PlanEntry,
        parameters: Mapping[str, Any],
        *,
        instance: InstanceView | None,
        lookup: InstanceLookup,
    ) -> None:
        """Checks of what the parameters name in the broker's own state (another instance,
        by `lookup`), and of an update or bind against `instance` as it is: raise
        InvalidParameters (400) before anything is written. Must not call any cloud. The
        default checks nothing."""
        return None

    @abc.abstractmethod
    def provision(self, op: OperationContext) -> Outcome: ...

    def update(self, op: OperationContext) -> Outcome:
        return Failed(f"{self.name} instances cannot be updated")

    @abc.abstractmethod
    def deprovision(self, op: OperationContext) -> Outcome:
        """Remove everything tagged with the instance (also what a cancelled or failed
        provision left); Done when nothing is left. Safe to run any number of times."""

    def bind(self, op: OperationContext) -> Outcome:
        return Failed(f"{self.name} instances are not bindable")

    def unbind(self, op: OperationContext) -> Outcome:
        return Done("nothing to remove")

    def inventory_clouds(self) -> list[str]:
        """The clouds `inventory` reads, one at a time (drift reports). Must not call any
        cloud."""
        return list(self.clouds.names())

    def inventory(self, cloud: str) -> Iterable[Found]:
        """Every resource in `cloud` tagged as this service's (drift reports). Per cloud, so
        that `broker repair` reports the clouds it can read and marks the ones it cannot as
        unchecked instead of losing the whole service's report to one unreachable cloud."""
        return ()
