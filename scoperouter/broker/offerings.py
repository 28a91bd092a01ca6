"""A service's catalog entry and plans, read from its section of the broker config.

Shared by the built-in services (server, image, volume, container): the ids a platform
registered stay stable (:func:`~scoperouter.broker.contract.stable_id` of the names unless the
config gives one), and every plan keeps its own settings (a flavor, a volume type) beside the
OSB fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scoperouter.broker.contract import CatalogEntry, JSONSchema, PlanEntry, Schemas, stable_id


def catalog_plans(
    service: str,
    settings: Mapping[str, Any],
    schemas: Schemas,
    required: Sequence[str] = (),
) -> tuple[PlanEntry, ...]:
    """The plans of a service from its config section (``plans``: a list of mappings with
    ``name``, ``description``, optional ``id``, ``free``, ``bindable``, ``metadata``,
    ``maximum_polling_duration``; every other key is the plan's own setting). Raises ValueError
    naming the plan when a setting in `required` is missing."""
    raw = settings.get("plans") or []
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{service}: plans: expected a non-empty list")
    known = {"id", "name", "description", "free", "bindable", "metadata"}
    known.add("maximum_polling_duration")
    plans = []
    for index, plan in enumerate(raw):
        if not isinstance(plan, Mapping) or not plan.get("name"):
            raise ValueError(f"{service}: plans[{index}]: expected a mapping with a name")
        own = {k: v for k, v in plan.items() if k not in known}
        for key in required:
            if not own.get(key):
                raise ValueError(f"{service}: plans[{index}] ({plan['name']}): {key} is required")
        plans.append(
            PlanEntry(
                id=str(plan.get("id") or stable_id(service, str(plan["name"]))),
                name=str(plan["name"]),
                description=str(plan.get("description") or plan["name"]),
                free=bool(plan.get("free", True)),
                bindable=plan.get("bindable"),
                schemas=schemas,
                maximum_polling_duration=plan.get("maximum_polling_duration"),
                metadata=dict(plan.get("metadata") or {}),
                settings=own,
            )
        )
    return tuple(plans)


def offering(
    service: str,
    settings: Mapping[str, Any],
    instance_schema: JSONSchema,
    *,
    description: str,
    display_name: str,
    tags: tuple[str, ...],
    required: Sequence[str] = (),
) -> CatalogEntry:
    """A bindable service's catalog entry from its config section: the id and description the
    config gives (else stable ones), its plans (:func:`catalog_plans`), one create schema."""
    schemas = Schemas(instance_create=instance_schema)
    return CatalogEntry(
        id=str(settings.get("id") or stable_id(service)),
        name=service,
        description=str(settings.get("description") or description),
        plans=catalog_plans(service, settings, schemas, required=required),
        bindable=True,
        tags=tags,
        metadata={"displayName": display_name},
    )


IMAGE_REF: JSONSchema = {"type": "string", "minLength": 1, "maxLength": 255}
