"""The assembled broker: config, database, secrets, clouds and the enabled services.

One :class:`Broker` is built per process (``serve``, the operator commands, tests) and shared by
the API and the worker threads. It also holds what is derived once from the services'
catalogs: the service/plan index and the compiled JSON-schema validators of every plan, so a
request costs a dictionary lookup and one validation, not a catalog walk.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from jsonschema import Draft4Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from scoperouter.broker.config import BrokerConfig, BrokerConfigError, ServiceConfig
from scoperouter.broker.contract import (
    ENTRY_POINT_GROUP,
    CatalogEntry,
    Clouds,
    InvalidParameters,
    JSONValue,
    OperationKind,
    PlanEntry,
    Service,
)
from scoperouter.broker.identity import Identity
from scoperouter.broker.secrets import Secrets
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

    def validate(self, which: str, kind: OperationKind, parameters: Mapping[str, Any]) -> None:
        """JSON schema of the plan, then the service's own checks; InvalidParameters naming
        the field (a JSON path under ``parameters``)."""
        validator = self.validators.get(which)
        if validator is not None:
            errors = sorted(validator.iter_errors(dict(parameters)), key=_error_order)
            if errors:
                field, message = describe_error(errors[0])
                raise InvalidParameters(field, message)
        self.service.validate(kind, self.plan, parameters)


def _error_order(error: ValidationError) -> tuple[int, str]:
    return (len(list(error.absolute_path)), str(error.validator))


def describe_error(error: ValidationError) -> tuple[str, str]:
    """A JSON-schema violation as (field, message) for a 400: the field as a path under
    ``parameters`` and what the schema asks for, NEVER the value given (a parameter may be
    cloud-init text holding passwords; jsonschema's own messages quote the value whole)."""
    path = "parameters" + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
    )
    keyword = str(error.validator)
    expected: JSONValue = error.validator_value  # the schema's value of the keyword
    if keyword == "required":
        names = [
            n for n in expected if isinstance(error.instance, Mapping) and n not in error.instance
        ]
        return (f"{path}.{names[0]}" if names else path), "required"
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if keyword == "additionalProperties" and isinstance(error.instance, Mapping):
        known = set((schema.get("properties") or {}).keys())
        patterns = list((schema.get("patternProperties") or {}).keys())
        extra = sorted(
            str(k)
            for k in error.instance
            if k not in known and not any(re.search(p, str(k)) for p in patterns)
        )
        if extra:
            return f"{path}.{_name(extra[0])}", "not a parameter of this plan"
    messages: dict[str, Callable[[], str]] = {
        "type": lambda: f"expected {_kind(expected)}",
        "maxLength": lambda: f"longer than {expected} characters",
        "minLength": lambda: f"shorter than {expected} characters",
        "maximum": lambda: f"above the maximum of {expected}",
        "minimum": lambda: f"below the minimum of {expected}",
        "exclusiveMaximum": lambda: f"not below {expected}",
        "exclusiveMinimum": lambda: f"not above {expected}",
        "multipleOf": lambda: f"not a multiple of {expected}",
        "pattern": lambda: f"does not match the pattern {_short(str(expected))}",
        "format": lambda: f"not in the {expected} format",
        "enum": lambda: f"not one of {_short(', '.join(json.dumps(v) for v in expected))}",
        "const": lambda: f"must be {_short(json.dumps(expected))}",
        "maxItems": lambda: f"more than {expected} items",
        "minItems": lambda: f"fewer than {expected} items",
        "uniqueItems": lambda: "items are not unique",
        "maxProperties": lambda: f"more than {expected} properties",
        "minProperties": lambda: f"fewer than {expected} properties",
        "additionalProperties": lambda: "unexpected properties",
        "additionalItems": lambda: "unexpected items",
        "dependencies": lambda: "a property it depends on is missing",
        "not": lambda: "matches a schema it must not match",
    }
    if keyword in messages:
        return path, messages[keyword]()
    return path, f"does not satisfy the schema's {keyword!r} rule"


def _kind(expected: object) -> str:
    kinds = expected if isinstance(expected, list) else [expected]
    return " or ".join(str(k) for k in kinds)


def _name(key: str) -> str:
    """A property name as a path part: names are the plan's vocabulary, not values, but an
    unexpected one is what the platform sent: shown short and printable only."""
    return _short(re.sub(r"[^\x21-\x7e]", "?", key), 64)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def _refs(node: object) -> list[str]:
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


def defined_service(name: str, kind: str) -> type[Service]:
    """The class of a service defined without Python (`type` in its config section)."""
    if kind == "ansible":
        from scoperouter.broker.services.ansible.service import service_class

        return service_class(name)
    from scoperouter.broker.services.heat import service_class as heat_class

    return heat_class(name)


def resolve_paths(config: BrokerConfig, kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Paths in a defined service's settings, relative to the config file."""
    out = dict(settings)
    keys = ("pack", "work_dir") if kind == "ansible" else ()
    for key in keys:
        if out.get(key):
            out[key] = str(config.path(Path(str(out[key]))))
    if kind == "heat":
        plans = []
        for plan in out.get("plans") or []:
            if isinstance(plan, Mapping) and plan.get("template"):
                plan = {**plan, "template": str(config.path(Path(str(plan["template"]))))}
            plans.append(plan)
        out["plans"] = plans
    return out


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
            settings = svc_config.service_settings()
            cls: type[Service] | None
            if svc_config.type is not None:
                cls = defined_service(name, svc_config.type)
                settings = resolve_paths(config, svc_config.type, settings)
            elif svc_config.plugin:
                cls = load_plugin(svc_config.plugin)
            else:
                cls = classes.get(name)
            if cls is None:
                known = ", ".join(sorted(classes)) or "none"
                raise BrokerConfigError(
                    f"services.{name}: no such service plug-in (installed: {known})"
                )
            service = cls(settings, self.clouds)
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
