"""The assembled broker: config, database, secrets, clouds and the enabled services.

One :class:`Broker` is built per process (``serve``, the operator commands, tests) and shared by
the API and the worker threads. It also holds what is derived once from the services'
catalogs: the service/plan index and the compiled JSON-schema validators of every plan, so a
request costs a dictionary lookup and one validation, not a catalog walk.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from jsonschema import Draft4Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from scoperouter.broker.config import BrokerConfig, BrokerConfigError, ServiceConfig
from scoperouter.broker.identity import Identity
from scoperouter.broker.secrets import Secrets
from scoperouter.broker.services.base import (
    ENTRY_POINT_GROUP,
    CatalogEntry,
    Clouds,
    InvalidParameters,
    PlanEntry,
    Service,
)
from scoperouter.broker.store import Store

log = logging.getLogger("scoperouter.broker")

MAX_SCHEMA_BYTES = 64 * 1024  # OSB: schemas MUST NOT be larger than 64 kB


@dataclass(frozen=True)
class PlanRef:
    service: Service
    config: ServiceConfig
    entry: CatalogEntry
    plan: PlanEntry
    validators: Mapping[str, Validator]  # "instance_create", "instance_update", "binding_create"

    @property
    def bindable(self) -> bool:
        return self.plan.bindable if self.plan.bindable is not None else self.entry.bindable

    @property
    def plan_updateable(self) -> bool:
        if self.plan.plan_updateable is not None:
            return self.plan.plan_updateable
        return self.entry.plan_updateable

    def validate(self, which: str, kind: Any, parameters: Mapping[str, Any]) -> None:
        """JSON schema of the plan, then the service's own checks; InvalidParameters naming
        the field (a JSON path under ``parameters``)."""
        validator = self.validators.get(which)
        if validator is not None:
            errors = sorted(validator.iter_errors(dict(parameters)), key=_error_order)
            if errors:
                first = errors[0]
                path = "".join(
                    f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path
                )
                missing = _missing_property(first)
                if missing:
                    path += f".{missing}"
                raise InvalidParameters(f"parameters{path}", first.message)
        self.service.validate(kind, self.plan, parameters)


def _error_order(error: Any) -> tuple[int, str]:
    return (len(list(error.absolute_path)), str(error.message))


def _missing_property(error: Any) -> str | None:
    if error.validator == "required" and isinstance(error.message, str):
        name = error.message.split("'")
        return name[1] if len(name) > 2 else None
    return None


def compile_schema(schema: Mapping[str, Any], where: str) -> Validator:
    """A validator for a plan's schema. The `$schema` key picks the draft (draft-04 or later,
    as the spec requires); no external references; at most 64 kB."""
    if "$schema" not in schema:
        raise BrokerConfigError(f"{where}: a parameters schema needs a $schema key (OSB)")
    if len(json.dumps(schema).encode()) > MAX_SCHEMA_BYTES:
        raise BrokerConfigError(f"{where}: schema larger than 64 kB")
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise BrokerConfigError(f"{where}: external reference {ref!r} (OSB forbids them)")
    cls = validator_for(schema, default=Draft4Validator)
    try:
        cls.check_schema(dict(schema))
    except SchemaError as exc:
        raise BrokerConfigError(f"{where}: invalid JSON schema: {exc.message}") from None
    validator: Validator = cls(dict(schema))
    return validator


def _refs(node: Any) -> list[str]:
    if isinstance(node, Mapping):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        for value in node.values():
            found += _refs(value)
        return found
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []


def load_plugin(path: str) -> type[Service]:
    """A service class named ``package.module:Class``."""
    import importlib

    module_name, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BrokerConfigError(f"plugin {path!r} cannot be loaded: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Service)):
        raise BrokerConfigError(f"plugin {path!r} is not a Service subclass")
    return cls


def service_classes() -> dict[str, type[Service]]:
    """Services installed as plug-ins (entry point group ``scoperouter.broker.services``)."""
    found: dict[str, type[Service]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.load()
    return found


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        store: Store | None = None,
        secrets: Secrets | None = None,
        clouds: Clouds | None = None,
        service_classes_: Mapping[str, type[Service]] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.store = store if store is not None else Store(config.database_url())
        self.secrets = secrets if secrets is not None else Secrets(config.secret_keys())
        self.clouds = clouds if clouds is not None else make_clouds(config)
        self.identity = Identity(config.identity)
        classes = dict(service_classes_) if service_classes_ is not None else service_classes()
        self.services: dict[str, Service] = {}
        self.service_configs: dict[str, ServiceConfig] = {}
        self.plans: dict[tuple[str, str], PlanRef] = {}
        self.offerings: dict[str, CatalogEntry] = {}
        for name, svc_config in config.enabled_services().items():
            cls = load_plugin(svc_config.plugin) if svc_config.plugin else classes.get(name)
            if cls is None:
                known = ", ".join(sorted(classes)) or "none"
                raise BrokerConfigError(
                    f"services.{name}: no such service plug-in (installed: {known})"
                )
            service = cls(svc_config.service_settings(), self.clouds)
            entry = service.catalog()
            if entry.id in self.offerings:
                raise BrokerConfigError(f"services.{name}: service id {entry.id} used twice")
            self.services[name] = service
            self.service_configs[entry.id] = svc_config
            self.offerings[entry.id] = entry
            for plan in entry.plans:
                validators: dict[str, Validator] = {}
                for which in ("instance_create", "instance_update", "binding_create"):
                    schema = getattr(plan.schemas, which)
                    if schema is not None:
                        validators[which] = compile_schema(
                            schema, f"services.{name}: plan {plan.name}: {which}"
                        )
                self.plans[(entry.id, plan.id)] = PlanRef(
                    service=service,
                    config=svc_config,
                    entry=entry,
                    plan=plan,
                    validators=validators,
                )

    def plan(self, service_id: str, plan_id: str) -> PlanRef | None:
        return self.plans.get((service_id, plan_id))

    def service_by_id(self, service_id: str) -> Service | None:
        entry = self.offerings.get(service_id)
        if entry is None:
            return None
        for service in self.services.values():
            if service.catalog().id == service_id:
                return service
        return None

    def close(self) -> None:
        self.store.dispose()


def make_clouds(config: BrokerConfig) -> Clouds:
    from scoperouter.broker.clouds import CloudAccess, FederationClouds

    access = [
        CloudAccess(name=name, entry=cloud.entry, region=cloud.region)
        for name, cloud in config.clouds.items()
    ]
    return FederationClouds(
        access,
        config_files=[config.path(p) for p in config.clouds_yaml] or None,
        secure_files=[config.path(p) for p in config.secure_yaml] or None,
    )
