"""Remove what the upstream suites leak from the lab, by the suites' own naming patterns only.

The suites clean up after themselves when a test passes; a failing or interrupted test leaves
projects, domains, users, roles, services (their endpoints go with them), regions, flavors,
images, servers, keypairs, stacks, volumes and their snapshots ... behind (Tempest's dynamic
credentials too: a project and users per test class). Object storage containers are not swept:
they live in the accounts of the projects that made them, which the cloud's admin does not
list (swift's reseller role would), and they go unused once their project is deleted.
Everything they create is named in one of a few ways (``leaked`` below); nothing else is ever
touched, so the resources of other users of the lab (``osb...``, ``e2e-...``, ``peer-...``, the
seed data) are safe by construction. One unnamed kind: access rules, which keystone keeps after
the application credential that made them is deleted (the suites' tests do that, on the lab's
own users): the rules of the suites' users that no application credential uses any more are
deleted (keystone refuses to delete a rule in use anyway); the openstacksdk test that counts
its user's rules would see every earlier run's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# openstacksdk's getUniqueString(prefix): "<prefix><unix time>-<uuid4 hex>"
_SDK_UNIQUE = re.compile(r"\d{10}-[0-9a-f]{32}")
# tempest's data_utils.rand_name(name) (python-openstackclient): "tempest-<name>-<number>"
_TEMPEST = re.compile(r"^tempest-")
# python-openstackclient: uuid.uuid4().hex names (servers, flavors, images, keypairs ...)
_UUID_HEX = re.compile(r"^[0-9a-f]{32}$")
# openstacksdk placement tests: f"CUSTOM_{uuid4().hex.upper()}" resource classes
_CUSTOM_CLASS = re.compile(r"^CUSTOM_[0-9A-F]{32}$")
# openstacksdk cloud-layer identity tests: 'test_' + 5 random lowercase letters (+ suffix)
_CLOUD_IDENTITY = re.compile(r"^test_[a-z]{5}(_|$)")
# fixed names in openstacksdk's tests: images, a server, the cloud layer's service type, and
# the names its domain test renames a domain to (its own cleanup then misses that domain)
_FIXED = frozenset(
    {"Test Image", "Test Image for Sharing", "needstobeshortandlowercase", "test_type",
     "updated name", "updated name 2"}
)  # fmt: skip


def leaked(name: str | None) -> bool:
    """Is `name` one the upstream suites give to what they create?"""
    if not name:
        return False
    return bool(
        name in _FIXED
        or _SDK_UNIQUE.search(name)
        or _TEMPEST.match(name)
        or _UUID_HEX.match(name)
        or _CUSTOM_CLASS.match(name)
        or _CLOUD_IDENTITY.match(name)
    )


@dataclass
class Report:
    deleted: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        done = ", ".join(f"{n} {kind}" for kind, n in sorted(self.deleted.items()) if n)
        text = done or "nothing leaked"
        if self.errors:
            text += f"; {len(self.errors)} could not be deleted (first: {self.errors[0]})"
        return text


def _sweep(
    report: Report,
    kind: str,
    items: Callable[[], Iterable[Any]],
    delete: Callable[[Any], object],
    name: Callable[[Any], str | None] = lambda r: getattr(r, "name", None),
) -> None:
    try:
        found = [r for r in items() if leaked(name(r))]
    except Exception as exc:  # a service the cloud lacks, a listing refused: report, go on
        report.errors.append(f"listing {kind}: {type(exc).__name__}: {exc}"[:300])
        return
    for resource in found:
        try:
            delete(resource)
            report.deleted[kind] = report.deleted.get(kind, 0) + 1
        except Exception as exc:
            report.errors.append(f"{kind} {name(resource)}: {type(exc).__name__}: {exc}"[:300])


def clean(admin: Any, system: Any | None = None) -> Report:
    """Delete every leaked resource visible to `admin` (an openstacksdk Connection of a
    project admin); limits need `system` (the same user, system scope)."""
    r = Report()
    c, ident, img = admin.compute, admin.identity, admin.image

    def delete_server(s: Any) -> None:
        c.delete_server(s, force=False)
        c.wait_for_delete(s, wait=120)

    if admin.has_service("orchestration"):  # a stack owns servers, volumes ...: first
        orch = admin.orchestration

        def delete_stack(st: Any) -> None:
            orch.delete_stack(st)
            orch.wait_for_delete(st, wait=300)

        _sweep(r, "stacks", lambda: orch.stacks(all_tenants=True), delete_stack)
    _sweep(r, "servers", lambda: c.servers(all_projects=True), delete_server)
    if admin.has_service("block-storage"):  # after the servers: their volumes are detached
        bs = admin.block_storage

        def delete_volume(v: Any) -> None:
            bs.delete_volume(v, cascade=True)  # its snapshots with it
            bs.wait_for_delete(v, wait=120)

        _sweep(r, "volume snapshots", lambda: bs.snapshots(all_projects=True), bs.delete_snapshot)
        _sweep(r, "volumes", lambda: bs.volumes(all_projects=True), delete_volume)
        _sweep(r, "volume types", bs.types, bs.delete_type)
    _sweep(r, "server groups", lambda: c.server_groups(all_projects=True), c.delete_server_group)
    if admin.has_service("network"):
        net = admin.network
        _sweep(r, "ports", net.ports, net.delete_port)
        _sweep(r, "subnets", net.subnets, net.delete_subnet)
        _sweep(r, "networks", net.networks, net.delete_network)
    _sweep(
        r, "keypairs", lambda: _keypairs(admin), lambda k: c.delete_keypair(k, user_id=k.user_id)
    )
    _sweep(r, "flavors", lambda: c.flavors(is_public=None), c.delete_flavor)
    _sweep(r, "aggregates", c.aggregates, lambda a: _delete_aggregate(admin, a))
    _sweep(r, "images", lambda: img.images(), _unprotect_and_delete(admin))
    _sweep(
        r,
        "metadef namespaces",
        img.metadef_namespaces,
        img.delete_metadef_namespace,
        lambda n: n.namespace,
    )
    if admin.has_service("placement"):
        p = admin.placement
        _sweep(r, "resource providers", p.resource_providers, p.delete_resource_provider)
        _sweep(r, "resource classes", p.resource_classes, p.delete_resource_class)
    if system is not None:
        sid = system.identity
        _sweep(r, "limits", sid.limits, sid.delete_limit, lambda x: x.resource_name)
        _sweep(
            r,
            "registered limits",
            sid.registered_limits,
            sid.delete_registered_limit,
            lambda x: x.resource_name,
        )
    # another user's access rules and credentials: keystone lets only the system scope see them
    _sweep_access_rules(r, system.identity if system is not None else ident)
    _sweep(r, "users", ident.users, ident.delete_user)
    _sweep(r, "groups", ident.groups, ident.delete_group)
    _sweep(r, "projects", ident.projects, ident.delete_project)
    _sweep(r, "roles", ident.roles, ident.delete_role)
    _sweep(r, "services", ident.services, ident.delete_service)  # endpoints go with them
    _sweep(r, "services", ident.services, ident.delete_service, lambda s: s.type)
    _sweep(r, "regions", ident.regions, ident.delete_region, lambda x: x.id)
    _sweep(r, "endpoint groups", ident.endpoint_groups, ident.delete_endpoint_group)
    _sweep(
        r,
        "identity providers",
        ident.identity_providers,
        ident.delete_identity_provider,
        lambda x: x.id,
    )
    _sweep(r, "mappings", ident.mappings, ident.delete_mapping, lambda x: x.id)
    _sweep(
        r,
        "service providers",
        ident.service_providers,
        ident.delete_service_provider,
        lambda x: x.id,
    )
    _sweep(r, "domains", ident.domains, lambda d: _delete_domain(admin, d))
    return r


SUITE_USERS = frozenset({"admin", "demo", "alt_demo"})  # the lab's users the suites log in as


def _sweep_access_rules(report: Report, ident: Any) -> None:
    """Access rules of the suites' users that no application credential of theirs uses."""
    try:
        found = []
        for user in ident.users():
            if user.name not in SUITE_USERS and not leaked(user.name):
                continue
            used = {
                str(rule.get("id"))
                for cred in ident.application_credentials(user)
                for rule in (getattr(cred, "access_rules", None) or [])
            }
            found += [(user, rule) for rule in ident.access_rules(user) if rule.id not in used]
    except Exception as exc:
        report.errors.append(f"listing access rules: {type(exc).__name__}: {exc}"[:300])
        return
    for user, rule in found:
        try:
            ident.delete_access_rule(user, rule)
            report.deleted["access rules"] = report.deleted.get("access rules", 0) + 1
        except Exception as exc:
            report.errors.append(f"access rule {rule.id}: {type(exc).__name__}: {exc}"[:300])


def _keypairs(admin: Any) -> Iterable[Any]:
    """Every user's keypairs (an admin lists another user's with user_id)."""
    out = list(admin.compute.keypairs())
    for user in admin.identity.users():
        if leaked(user.name) or user.name in ("demo", "alt_demo"):
            out += list(admin.compute.keypairs(user_id=user.id))
    seen: set[tuple[str, str]] = set()
    unique = []
    for k in out:
        key = (k.name, k.user_id or "")
        if key not in seen:
            seen.add(key)
            unique.append(k)
    return unique


def _delete_aggregate(admin: Any, aggregate: Any) -> None:
    for host in aggregate.hosts or []:
        admin.compute.remove_host_from_aggregate(aggregate, host)
    admin.compute.delete_aggregate(aggregate)


def _unprotect_and_delete(admin: Any) -> Callable[[Any], None]:
    def go(image: Any) -> None:
        if image.is_protected:
            admin.image.update_image(image, is_protected=False)
        admin.image.delete_image(image)

    return go


def _delete_domain(admin: Any, domain: Any) -> None:
    if domain.is_enabled:
        admin.identity.update_domain(domain, is_enabled=False)
    admin.identity.delete_domain(domain)
