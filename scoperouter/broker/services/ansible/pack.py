"""A pack's ``service.yml``: the offering, its plans and parameters, and its playbooks.

::

    name: openstack-server-keypair        # the service name: the broker config enables it
    description: A server with its own key pair and security group
    bindable: true                        # default true
    plan_updateable: false                # default false
    tags: [openstack, compute]
    metadata: {displayName: Server with key pair}
    project: space                        # where runs are scoped: the platform space's keystone
                                          # project in the chosen cloud (default), or "broker":
                                          # the broker account's own project
    placement:                            # which cloud: the `where` parameter (cloud, scope or
      default: {strategy: most-free}      # strategy most-free) unless `parameter: false`;
      demand: {VCPU: 1, MEMORY_MB: 512}   # what one instance takes (placement classes)
    binding:
      credential: false                   # true: the broker issues an application credential
      roles: [member]                     # per binding (as openstack-project does), limited
      access_rules: []                    # to these roles and access rules ({project_id} and
      lifetime: null                      # the instance's metadata keys are filled in)
    plans:
      - name: small
        description: 1 VCPU
        vars: {flavor: m1.tiny}           # extra vars of every run of this plan
        demand: {VCPU: 1}                 # overrides placement.demand
    parameters:                           # JSON schemas (draft-04 unless $schema says)
      provision: {type: object, properties: {...}}
      update: {...}                       # absent: no parameter can be updated
      bind: {...}
    playbooks: {provision: provision.yml} # default <action>.yml
    retries: 0                            # a failed run is tried again this many times
    secret_parameters: [user_data]        # also scrubbed from Ansible output (besides any
                                          # property a schema marks "writeOnly": true)

Everything is checked when the broker starts (a bad pack is a config error naming the file and
the key), never on a request.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scoperouter.broker import placement
from scoperouter.broker.config import BrokerConfigError
from scoperouter.broker.services import placed
from scoperouter.broker.services.base import (
    DRAFT4,
    CatalogEntry,
    PlanEntry,
    Schemas,
    stable_id,
)
from scoperouter.broker.services.placed import PlacementSpec

ACTIONS = ("provision", "update", "deprovision", "bind", "unbind")
Action = Literal["provision", "update", "deprovision", "bind", "unbind"]
NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanSpec(_Strict):
    name: str = Field(pattern=NAME)
    description: str = Field(min_length=1)
    id: str | None = Field(default=None, min_length=1, max_length=255)
    free: bool = True
    bindable: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    vars: dict[str, Any] = Field(default_factory=dict)
    demand: dict[str, float] | None = None
    maximum_polling_duration: int | None = Field(default=None, gt=0)


class BindingSpec(_Strict):
    credential: bool = False
    roles: tuple[str, ...] | None = None
    access_rules: tuple[dict[str, str], ...] = ()
    lifetime: float | None = Field(default=None, gt=0)


class ParametersSpec(_Strict):
    provision: dict[str, Any] | None = None
    update: dict[str, Any] | None = None
    bind: dict[str, Any] | None = None


class PackSpec(_Strict):
    name: str = Field(pattern=NAME)
    description: str = Field(min_length=1)
    id: str | None = Field(default=None, min_length=1, max_length=255)
    bindable: bool = True
    plan_updateable: bool = False
    binding_rotatable: bool = False
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = Field(default_factory=dict)
    project: Literal["space", "broker"] = "space"
    placement: PlacementSpec = PlacementSpec()
    binding: BindingSpec = BindingSpec()
    plans: tuple[PlanSpec, ...] = Field(min_length=1)
    parameters: ParametersSpec = ParametersSpec()
    playbooks: dict[Action, str] = Field(default_factory=dict)
    retries: int = Field(default=0, ge=0, le=5)
    secret_parameters: tuple[str, ...] = ()


class Pack:
    """A loaded, checked pack: its spec, its directory and the playbook of each action."""

    def __init__(self, spec: PackSpec, directory: Path) -> None:
        self.spec = spec
        self.directory = directory
        self.playbooks: dict[str, str] = {}
        for action in self.actions():
            name = spec.playbooks.get(action, f"{action}.yml")  # type: ignore[call-overload]
            path = (directory / name).resolve()
            if not path.is_relative_to(directory.resolve()):
                raise BrokerConfigError(f"{self._where()}: playbooks.{action}: outside the pack")
            if not path.is_file():
                raise BrokerConfigError(
                    f"{self._where()}: playbooks.{action}: no file {name} in {directory}"
                )
            self.playbooks[action] = str(path.relative_to(directory.resolve()))
        for name in spec.playbooks:
            if name not in self.playbooks:
                raise BrokerConfigError(
                    f"{self._where()}: playbooks.{name}: this pack has no {name} action "
                    "(update needs parameters.update or plan_updateable; bind and unbind "
                    "need a bindable plan)"
                )

    def _where(self) -> str:
        return str(self.directory / "service.yml")

    @property
    def name(self) -> str:
        return self.spec.name

    def updatable(self) -> bool:
        return self.spec.parameters.update is not None or self.spec.plan_updateable

    def bindable(self) -> bool:
        spec = self.spec
        return spec.bindable or any(plan.bindable for plan in spec.plans)

    def actions(self) -> list[str]:
        """The actions this pack needs a playbook for."""
        actions = ["provision", "deprovision"]
        if self.updatable():
            actions.append("update")
        if self.bindable():
            actions += ["bind", "unbind"]
        return actions

    def check_clouds(self, clouds: tuple[str, ...]) -> None:
        """The `where` of placement.default names clouds of the broker."""
        try:
            placed.check_default(self.spec.placement, clouds)
        except placement.PlacementError as exc:
            raise BrokerConfigError(f"{self._where()}: placement.default: {exc}") from None

    # ------------------------------------------------------------------------ catalog

    def schemas(self, clouds: tuple[str, ...]) -> Schemas:
        params = self.spec.parameters
        provision = _object_schema(params.provision)
        try:
            placed.add_where(provision, self.spec.placement, clouds)
        except ValueError as exc:
            raise BrokerConfigError(f"{self._where()}: parameters.provision: {exc}") from None
        return Schemas(
            instance_create=provision,
            instance_update=_object_schema(params.update) if params.update is not None else None,
            binding_create=_object_schema(params.bind) if self.bindable() else None,
        )

    def catalog(self, clouds: tuple[str, ...]) -> CatalogEntry:
        spec = self.spec
        schemas = self.schemas(clouds)
        plans = tuple(
            PlanEntry(
                id=plan.id or stable_id("ansible", spec.name, plan.name),
                name=plan.name,
                description=plan.description,
                free=plan.free,
                bindable=plan.bindable,
                plan_updateable=None,
                schemas=schemas,
                maximum_polling_duration=plan.maximum_polling_duration,
                metadata=dict(plan.metadata),
                settings={"vars": dict(plan.vars), "demand": plan.demand},
            )
            for plan in spec.plans
        )
        return CatalogEntry(
            id=spec.id or stable_id("ansible", spec.name),
            name=spec.name,
            description=spec.description,
            plans=plans,
            bindable=spec.bindable,
            plan_updateable=spec.plan_updateable,
            binding_rotatable=spec.binding_rotatable,
            tags=spec.tags,
            metadata=dict(spec.metadata),
        )

    def secret_names(self) -> set[str]:
        """Parameters whose values are secret: listed in ``secret_parameters`` or marked
        ``writeOnly`` in a schema."""
        names = set(self.spec.secret_parameters)
        for schema in (self.spec.parameters.provision, self.spec.parameters.update,
                       self.spec.parameters.bind):  # fmt: skip
            for name, prop in ((schema or {}).get("properties") or {}).items():
                if isinstance(prop, Mapping) and prop.get("writeOnly") is True:
                    names.add(str(name))
        return names


def _object_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A pack's parameters schema as the catalog shows it: an object, draft-04 unless it says
    otherwise, no property other than those it lists unless it allows them."""
    out = copy.deepcopy(dict(schema or {}))
    out.setdefault("$schema", DRAFT4)
    out.setdefault("type", "object")
    out.setdefault("additionalProperties", False)
    out.setdefault("properties", {})
    return out


def load_pack(directory: Path) -> Pack:
    """Read and check the pack in `directory` (``service.yml`` and its playbooks)."""
    path = directory / "service.yml"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise BrokerConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise BrokerConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise BrokerConfigError(f"{path}: expected a mapping")
    try:
        spec = PackSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise BrokerConfigError(f"{path}: {loc}: {first['msg']}") from None
    names = [plan.name for plan in spec.plans]
    if len(set(names)) != len(names):
        raise BrokerConfigError(f"{path}: plans: a plan name is used twice")
    for name in spec.secret_parameters:
        if not re.match(r"^[A-Za-z0-9_.-]+$", name):
            raise BrokerConfigError(f"{path}: secret_parameters: {name!r} is not a name")
    return Pack(spec, directory)
