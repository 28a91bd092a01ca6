"""Where an instance of a service defined without Python lives (ansible packs, heat plans).

Such a service offers the broker's `where` parameter (one cloud, a scope, or the most-free
strategy: :mod:`scoperouter.broker.placement`), has a default for it, and says what one
instance takes (the demand most-free ranks by). The first provision pass chooses the cloud and
the keystone project, and records both (with the scope) in the instance's metadata before
anything is built; every later pass and operation uses what was recorded, so a pass re-run
after a crash never places the instance anew.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scoperouter.broker import placement
from scoperouter.broker.contract import (
    CatalogEntry,
    Clouds,
    Failed,
    InvalidParameters,
    OperationContext,
    OperationKind,
    Pending,
    PlanEntry,
    Service,
)
from scoperouter.broker.openstack_helpers import error_text, space_project

if TYPE_CHECKING:
    from openstack.connection import Connection

WHERE_PARAMETER = "where"
RETRY_SECONDS = 15.0  # no cloud could be asked: ask again this much later

Target = dict[str, Any]  # {"cloud": ..., "project_id": ..., "scope": JSON text or None}


class PlacementSpec(BaseModel):
    """``placement`` of a pack's service.yml or a heat service's config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the `where` used when a provision gives none (None: most-free)
    default: dict[str, Any] | None = None
    # offer `where` to platforms (false: always `default`)
    parameter: bool = True
    # what one instance takes from a cloud (placement resource classes): most-free's demand
    demand: dict[str, float] = Field(default_factory=dict)


ProjectMode = Literal["space", "broker"]


def where_schema(clouds: tuple[str, ...]) -> dict[str, Any]:
    """The broker's `where` parameter: one cloud, a scope, or the most-free strategy."""
    return {
        "type": "object",
        "description": "where the instance goes: one of cloud, scope, strategy",
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
        "properties": {
            "cloud": {"type": "string", "enum": list(clouds)},
            "scope": {
                "type": "object",
                "required": ["compute"],
                "additionalProperties": {"type": "string", "enum": list(clouds)},
            },
            "strategy": {"type": "string", "enum": ["most-free"]},
        },
    }


def add_where(schema: dict[str, Any], spec: PlacementSpec, clouds: tuple[str, ...]) -> None:
    """Offer `where` in a provision schema (unless the spec says not to). Raises ValueError
    when the schema already has a parameter of that name."""
    if not spec.parameter:
        return
    properties = schema.setdefault("properties", {})
    if WHERE_PARAMETER in properties:
        raise ValueError(
            f"'{WHERE_PARAMETER}' is the broker's (placement); set placement.parameter: false "
            "to use the name"
        )
    properties[WHERE_PARAMETER] = where_schema(clouds)


def where_of(spec: PlacementSpec, parameters: Mapping[str, Any]) -> Mapping[str, Any] | None:
    given = parameters.get(WHERE_PARAMETER) if spec.parameter else None
    return given if given is not None else spec.default


def check_default(spec: PlacementSpec, clouds: tuple[str, ...]) -> None:
    """The default `where` names clouds of the broker; raises PlacementError."""
    if spec.default is not None:
        placement.parse_where(spec.default, clouds)


def validate(spec: PlacementSpec, parameters: Mapping[str, Any], clouds: tuple[str, ...]) -> None:
    """A provision's `where` (or the default), checked before anything is written: 400."""
    try:
        placement.parse_where(where_of(spec, parameters), clouds)
    except placement.PlacementError as exc:
        raise InvalidParameters(f"parameters.{exc.field}", exc.message) from None


def choose(
    op: OperationContext,
    spec: PlacementSpec,
    project: ProjectMode,
    demand: Mapping[str, float] | None = None,
) -> Target | Failed | Pending:
    """The instance's cloud, project and scope: chosen by the first pass (saved in its
    progress and recorded as metadata), else now."""
    saved = op.progress.get("target")
    if saved:
        return dict(saved)
    names = op.clouds.names()
    try:
        strategy = placement.parse_where(where_of(spec, op.parameters), names)
    except placement.PlacementError as exc:
        return Failed(f"parameters.{exc.field}: {exc.message}")
    scope = None
    if isinstance(strategy, placement.Scoped):
        cloud, scope = strategy.cloud, strategy.scope.to_json()
    elif isinstance(strategy, placement.Explicit):
        cloud = strategy.cloud
    else:
        chosen = most_free(op, names, placement.Demand(dict(demand or spec.demand or {})))
        if isinstance(chosen, Failed | Pending):
            return chosen
        cloud = chosen
    op.set_cloud(cloud)  # durable before anything is built: deprovision looks there
    if project == "space":
        project_id = space_project(op, cloud)
    else:
        project_id = str(op.clouds.connect(cloud).current_project_id)
    target: Target = {"cloud": cloud, "project_id": project_id, "scope": scope}
    op.set_resources(**target)
    op.save(target=target)
    return target


def most_free(
    op: OperationContext, names: tuple[str, ...], demand: placement.Demand
) -> str | Failed | Pending:
    """The cloud with the largest fraction of `demand` left; Pending while a cloud could not
    be asked and none fits (a cloud's bad minute), Failed when every answer says no."""
    snapshots: dict[str, placement.Snapshot] = {}
    unreachable = False
    for cloud in names:
        try:
            snapshots[cloud] = op.clouds.capacity(cloud)
        except Exception as exc:
            snapshots[cloud] = placement.Unavailable(cloud, error_text(exc))
            unreachable = True
    ranking = placement.rank(snapshots, placement.MostFree(), demand)
    if ranking.candidates:
        return ranking.candidates[0].cloud
    why = ranking.why_not() or "no cloud is configured"
    if unreachable:
        return Pending(f"no cloud can take the instance now ({why}); asking again", RETRY_SECONDS)
    return Failed(f"no cloud can take the instance: {why}")


def recorded(op: OperationContext) -> Target | None:
    """Where the instance was placed (None: nothing was, the provision never got that far)."""
    if not op.instance.cloud:
        return None
    resources = op.instance.resources
    return {
        "cloud": op.instance.cloud,
        "project_id": resources.get("project_id"),
        "scope": resources.get("scope"),
    }


def in_default_cloud(settings: Mapping[str, Any], clouds: tuple[str, ...]) -> PlacementSpec:
    """The placement of a built-in storage service: `where` offered, by default the config's
    ``default_cloud`` (else the first cloud): storage takes no compute to rank clouds by."""
    default = settings.get("default_cloud") or (clouds[0] if clouds else None)
    return PlacementSpec(default={"cloud": default} if default else None)


def connect(op: OperationContext, target: Mapping[str, Any]) -> Connection:
    """A connection where the instance lives: its cloud's router, its project, its scope."""
    return op.clouds.connect(
        str(target["cloud"]), project_id=target.get("project_id"), scope=target.get("scope")
    )


class PlacedService(Service):
    """A service whose instances go where `where` (or the default) says: the catalog built
    by the subclass's constructor (`_catalog`), `where` checked before anything is written."""

    placement: PlacementSpec
    _catalog: CatalogEntry

    def catalog(self) -> CatalogEntry:
        return self._catalog

    def validate(self, kind: OperationKind, plan: PlanEntry, parameters: Mapping[str, Any]) -> None:
        if kind == "provision":
            validate(self.placement, parameters, self.clouds.names())


def managed_projects(clouds: Clouds, cloud: str) -> list[str]:
    """The keystone projects the broker manages in `cloud` (tagged as its own): where its
    storage lives, for `broker repair`."""
    from scoperouter.broker.identity import MANAGED_TAG, keystone

    return [str(p.id) for p in keystone(clouds.connect(cloud)).projects(tags=MANAGED_TAG)]


def describe(target: Mapping[str, Any]) -> str:
    """ "CloudOne", or "CloudOne (scope {...})"."""
    where = str(target["cloud"])
    if target.get("scope"):
        where += f" (scope {target['scope']})"
    return where
