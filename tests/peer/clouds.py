"""The clouds.yaml the upstream suites read, one per mode, made from the lab's own files.

The suites name their clouds as devstack does: ``devstack`` (an ordinary user), ``devstack-alt``
(another one, in another project), ``devstack-admin`` and ``devstack-system-admin`` (system
scope). They come from the lab's ``<cloud>``, ``<cloud>-alt`` and ``<cloud>-admin`` entries; the
mode decides where requests go:

* ``direct``: ``auth_url`` and one ``<service_type>_endpoint_override`` per routed service type
  at the backend (from the lab's federation.yaml), so no request of the suites enters a router.
  (The services' own calls to each other still use the catalog, as the lab is wired.) A
  backend URL with keystone's project substitution (object storage's ``/v1/AUTH_%(project_id)s``,
  orchestration's ``/v1/%(project_id)s``) is written with the entry's project id: openstacksdk's
  object store builds its URLs from the override as it is.
* ``router``: the entries as the lab wrote them (the catalog advertises the router).
* ``scoped``: the same plus ``scope:`` and scoperouter's openstacksdk ``vendor_hook``; the
  ``openstack`` CLI's ``--os-scope`` plugin reads the same ``scope:`` key.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

MODES = ("direct", "router", "scoped")
SDK_VENDOR_HOOK = "scoperouter.client:connection_hook"

# devstack's entry name -> suffix of the lab's entry for the cloud under test
ENTRIES = {
    "devstack": "",
    "devstack-alt": "-alt",
    "devstack-admin": "-admin",
    "devstack-system-admin": "-admin",
}


class ConfigMissing(LookupError):
    """The lab's files lack something the suites need (an old lab: run `scoperouter lab up`)."""


def backends(federation: Mapping[str, Any], cloud: str) -> dict[str, str]:
    """service type -> the backend URL of its public endpoint, from a federation config."""
    try:
        services = federation["clouds"][cloud]["services"]
    except (KeyError, TypeError):
        raise ConfigMissing(f"cloud {cloud!r} is not in the lab's federation.yaml") from None
    out = {}
    for stype, interfaces in services.items():
        public = interfaces.get("public") if isinstance(interfaces, Mapping) else None
        if public and public.get("backend"):
            out[stype] = str(public["backend"])
    return out


_PROJECT_TEMPLATE = re.compile(r"%\((project_id|tenant_id)\)s")


def with_project(url: str, project_id: str | None) -> str | None:
    """`url` with keystone's ``%(project_id)s`` / ``%(tenant_id)s`` filled in; None when it has
    one and there is no project (a system-scoped entry)."""
    if not _PROJECT_TEMPLATE.search(url):
        return url
    return _PROJECT_TEMPLATE.sub(project_id, url) if project_id else None


def suite_clouds(
    lab_clouds: Mapping[str, Any],
    federation: Mapping[str, Any],
    cloud: str,
    mode: str,
    scope: Mapping[str, str],
    project_ids: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``clouds:`` mapping for one mode. `lab_clouds` is the lab's clouds.yaml ``clouds``
    mapping, `cloud` the federation name of the cloud under test (``CloudOne``); `project_ids`:
    the id of each lab entry's project (``cloudone-alt`` -> id), for the direct mode's
    templated backend URLs (a templated service without it keeps the catalog's endpoint)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    slug = cloud.lower()
    direct = backends(federation, cloud) if mode == "direct" else {}
    if mode == "direct" and "identity" not in direct:
        raise ConfigMissing(f"{cloud} has no identity backend in the lab's federation.yaml")
    out: dict[str, Any] = {}
    for name, suffix in ENTRIES.items():
        source = lab_clouds.get(slug + suffix)
        if not isinstance(source, Mapping) or "auth" not in source:
            raise ConfigMissing(
                f"the lab's clouds.yaml has no entry {slug + suffix!r} (an older lab: run "
                "`scoperouter lab up`)"
            )
        entry = copy.deepcopy(dict(source))
        auth = entry["auth"]
        if name == "devstack-system-admin":
            for key in ("project_name", "project_id", "project_domain_name", "project_domain_id"):
                auth.pop(key, None)
            auth["system_scope"] = "all"
        if mode == "direct":
            auth["auth_url"] = direct["identity"]
            project = (project_ids or {}).get(slug + suffix) if "project_name" in auth else None
            for stype, url in sorted(direct.items()):
                override = with_project(url, project)
                if override is not None:
                    entry[f"{stype.replace('-', '_')}_endpoint_override"] = override
        if mode == "scoped":
            entry["scope"] = dict(scope)
            entry["vendor_hook"] = SDK_VENDOR_HOOK
        out[name] = entry
    return out
