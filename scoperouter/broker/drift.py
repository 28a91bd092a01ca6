"""Drift between the broker's database and the clouds (``scoperouter broker repair``).

Each service lists what it finds in each cloud tagged as this broker's
(:meth:`~scoperouter.broker.contract.Service.inventory`); that is compared both ways with the
database: resources no live instance or binding owns (orphans), and live instances and bindings
whose resources are missing. A cloud a service cannot read is `unchecked`: nothing is claimed
missing there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from scoperouter.broker.contract import Found
from scoperouter.broker.tables import GONE

if TYPE_CHECKING:
    from scoperouter.broker.runtime import Broker


class Orphan(TypedDict):
    """A tagged resource in a cloud that no live instance or binding of the database owns."""

    service: str
    cloud: str
    kind: str
    id: str
    name: str | None
    instance_id: str | None
    binding_id: str | None


class Unchecked(TypedDict):
    service: str
    cloud: str
    error: str


class Checked(TypedDict):
    """What was compared: live records whose cloud was read, and the resources found."""

    instances: int
    bindings: int
    resources: int
    clouds: list[str]


class DriftReport(TypedDict):
    orphans: list[Orphan]
    # {"instance_id": ..., "cloud": ...} or {"binding_id": ..., "cloud": ...}
    missing: list[dict[str, str | None]]
    errors: list[str]
    unchecked: list[Unchecked]
    checked: Checked
    lines: list[str]


def drift(broker: Broker) -> DriftReport:
    """Compare what the services find in the clouds with the database (both ways)."""
    store = broker.store
    with store.read() as session:
        instances = {i.id: i for i in store.instances(session)}
        bindings = {b.id: b for i in instances for b in store.bindings_of(session, i)}
    lines: list[str] = []
    orphans: list[Orphan] = []
    missing: list[dict[str, str | None]] = []
    errors: list[str] = []
    unchecked: list[Unchecked] = []
    seen_instances: set[str] = set()
    seen_bindings: set[str] = set()
    checked: set[tuple[str, str]] = set()  # (service, cloud) read in full
    seen_resources: set[tuple[str, str, str]] = set()  # (cloud, kind, id) the services found
    for name, service in broker.services.items():
        try:
            clouds = service.inventory_clouds()
        except Exception as exc:
            errors.append(f"{name}: inventory failed: {exc}")
            continue
        found: list[Found] = []
        for cloud in clouds:
            try:
                found.extend(service.inventory(cloud))
            except Exception as exc:  # never "no drift" for what could not be read
                reason = f"{type(exc).__name__}: {exc}"
                unchecked.append({"service": name, "cloud": cloud, "error": reason})
                continue
            checked.add((name, cloud))
        for item in found:
            seen_resources.add((item.cloud, item.kind, item.id))
            record: Orphan = {
                "service": name,
                "cloud": item.cloud,
                "kind": item.kind,
                "id": item.id,
                "name": item.name,
                "instance_id": item.instance_id,
                "binding_id": item.binding_id,
            }
            if item.binding_id is not None:
                binding = bindings.get(item.binding_id)
                seen_bindings.add(item.binding_id)
                if binding is None or binding.state == GONE:
                    orphans.append(record)
            elif item.instance_id is not None:
                instance = instances.get(item.instance_id)
                seen_instances.add(item.instance_id)
                if instance is None or instance.state == GONE:
                    orphans.append(record)
    inventoried = {i.service_name for i in instances.values()} & set(broker.services)
    compared = {"instances": 0, "bindings": 0, "resources": len(seen_resources)}
    for instance in instances.values():
        if instance.service_name not in inventoried or instance.state != "provisioned":
            continue
        if (instance.service_name, instance.cloud) not in checked:
            continue  # its cloud could not be read: unknown, not missing
        compared["instances"] += 1
        if instance.id not in seen_instances:
            missing.append({"instance_id": instance.id, "cloud": instance.cloud})
        for binding in bindings.values():
            live = binding.instance_id == instance.id and binding.state == "bound"
            if live:
                compared["bindings"] += 1
            if live and binding.id not in seen_bindings:
                missing.append({"binding_id": binding.id, "cloud": instance.cloud})
    for o in orphans:
        owner = f"binding {o['binding_id']}" if o["binding_id"] else f"instance {o['instance_id']}"
        lines.append(
            f"orphan: {o['cloud']} {o['kind']} {o['id']} ({o['name'] or '-'}) of {owner}, "
            "which the broker does not hold (or deprovisioned)"
        )
    for m in missing:
        what = f"binding {m['binding_id']}" if "binding_id" in m else f"instance {m['instance_id']}"
        lines.append(
            f"missing: {what} is live in the database but nothing of it is in {m['cloud']}"
        )
    lines.extend(f"error: {e}" for e in errors)
    lines.extend(
        f"unchecked: {u['service']} in {u['cloud']}: could not be read ({u['error']}); "
        "drift there is unknown"
        for u in unchecked
    )
    read = sorted({cloud for _, cloud in checked})
    if not lines:
        # what was compared: live records whose cloud was read, and what the clouds hold
        # (never the deprovisioned rows the database keeps until `purge`)
        lines.append(
            f"no drift: {compared['instances']} live instance(s) and {compared['bindings']} "
            f"binding(s) match the {compared['resources']} tagged resource(s) found in "
            f"{len(read)} cloud(s) ({', '.join(read) or 'none'})"
        )
    elif not (orphans or missing or errors):
        lines.append("no drift in the clouds that could be read")
    return {
        "orphans": orphans,
        "missing": missing,
        "errors": errors,
        "unchecked": unchecked,
        "checked": {
            "instances": compared["instances"],
            "bindings": compared["bindings"],
            "resources": compared["resources"],
            "clouds": read,
        },
        "lines": lines,
    }
