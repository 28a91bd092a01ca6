"""Which upstream tests the runner runs.

``full``: the identity, image, compute and placement suites of openstacksdk (its proxy-layer
packages and the cloud-layer modules for the same services) and of python-openstackclient
(identity v3, image, compute, and the common commands: versions, quotas, configuration ...);
their object store, orchestration and block storage suites when the lab runs swift, heat and
cinder; and Tempest's API tests of the refstack interop guideline (``tempest-interop.txt``:
compute, identity, image, object storage, block storage). Identity v2 is not selected:
keystone has had no v2 API since Queens. Volume API v2 neither: cinder has had none since Xena.

``ci``: a subset that keeps `.ci/run` within its time budget while touching every path the
router has. openstacksdk (one process, cheap): identity, image and placement whole, compute
whole at the proxy layer and, at the cloud layer, the server life cycle once each way and what
surrounds servers. python-openstackclient (a CLI process per command costs ~1.5 s of CPU before
its first request, so this suite is the expensive part): each kind of request once: token and
catalog, the service life cycle (a service type the federation does not know appears in the
catalog while scoped CLIs keep working), projects, access rules, images, keypairs, versions,
availability zones, quotas (endpoints, application credentials, flavors and servers are
openstacksdk's, Tempest's and the e2e tests' in CI; the full selection has them). With swift,
heat and cinder: openstacksdk's object store suite, one stack (it boots a server), volumes,
snapshots, zones, types and limits; python-openstackclient's containers, volume list.
Tempest (one worker process per CPU, a test class per worker at a time, as OpenStack's gate
runs it): the interop list's identity and image tests whole and its object storage tests but
the object expiry's wait (cheap API calls); its compute tests of flavors, keypairs, zones,
server creation, instance actions, server tags, the negative server tests and versions; its
block storage tests of volumes (no snapshots, volume actions or attachments: openstacksdk's
tests and the lab's e2e tests make those).

A group that names a ``service`` (a service type) runs only when the lab runs that service
(``Lab.service_types``): swift, cinder and heat are not in every lab.
``full`` is the reference run by hand. docs/lab/openstack-suites.md lists the choice and the
cost.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

SDK = "openstacksdk"
OSC = "python-openstackclient"
TEMPEST = "tempest"
SUITES = (SDK, OSC, TEMPEST)
# The refstack interop guideline's required tests, as tempest ids (its header says which).
INTEROP_LIST = Path(__file__).with_name("tempest-interop.txt")


@dataclass(frozen=True)
class Group:
    """Tests of one module or package: all of them, or the named classes / Class::test.

    For Tempest, `module` is a test id prefix (``tempest.api.compute``), `only` names prefixes
    under it (a package, a module, a Class or Class.test: ``servers.test_servers``), and
    `listed` keeps only the tests of the interop list. `service`: a service type the lab must
    run, else the group is left out."""

    suite: str
    module: str
    only: tuple[str, ...] = ()
    service: str | None = None
    listed: bool = False


def runnable(groups: Sequence[Group], services: Collection[str] | None) -> list[Group]:
    """The groups whose service the lab runs (`services`: service types; None: every group)."""
    return [g for g in groups if g.service is None or services is None or g.service in services]


_SDK_FULL = (
    Group(SDK, "openstack.tests.functional.identity"),
    Group(SDK, "openstack.tests.functional.image"),
    Group(SDK, "openstack.tests.functional.compute"),
    Group(SDK, "openstack.tests.functional.placement"),
    Group(SDK, "openstack.tests.functional.cloud.test_identity"),
    Group(SDK, "openstack.tests.functional.cloud.test_image"),
    Group(SDK, "openstack.tests.functional.cloud.test_compute"),
)

_OSC_FULL = (
    Group(OSC, "openstackclient.tests.functional.identity.v3"),
    Group(OSC, "openstackclient.tests.functional.image"),
    Group(OSC, "openstackclient.tests.functional.compute"),
    Group(OSC, "openstackclient.tests.functional.common"),
)

# Object store, orchestration and block storage: only when the lab runs swift, heat, cinder.
# Volume API v2 (openstacksdk's block_storage.v2, python-openstackclient's volume.v2) is not
# selected: cinder has served no v2 since Xena.
_SDK_MORE_FULL = (
    Group(SDK, "openstack.tests.functional.object_store", service="object-store"),
    Group(SDK, "openstack.tests.functional.cloud.test_object_store", service="object-store"),
    Group(SDK, "openstack.tests.functional.orchestration", service="orchestration"),
    Group(SDK, "openstack.tests.functional.cloud.test_orchestration", service="orchestration"),
    Group(SDK, "openstack.tests.functional.block_storage.v3", service="block-storage"),
    Group(SDK, "openstack.tests.functional.cloud.test_block_storage", service="block-storage"),
)

_OSC_MORE_FULL = (
    Group(OSC, "openstackclient.tests.functional.object.v1", service="object-store"),
    Group(OSC, "openstackclient.tests.functional.volume.v3", service="block-storage"),
)

_SDK_CI = (
    Group(SDK, "openstack.tests.functional.identity"),
    Group(SDK, "openstack.tests.functional.image"),
    Group(SDK, "openstack.tests.functional.compute"),
    Group(SDK, "openstack.tests.functional.placement"),
    Group(SDK, "openstack.tests.functional.cloud.test_identity"),
    Group(SDK, "openstack.tests.functional.cloud.test_image"),
    # the cloud layer's server life cycle once each way, and everything around servers
    Group(
        SDK,
        "openstack.tests.functional.cloud.test_compute",
        (
            "TestCompute::test_create_and_delete_server",
            "TestCompute::test_list_all_servers",
            "TestCompute::test_get_server_console",
            "TestCompute::test_set_and_delete_metadata",
            "TestCompute::test_update_server",
            "TestCompute::test_get_image_id",
            "TestCompute::test_list_availability_zone_names",
            "TestAggregate",
            "TestFlavor",
            "TestKeypairs",
            "TestServerGroup",
            "TestComputeLimits",
            "TestComputeQuotas",
            "TestRangeSearch",
        ),
    ),
)

# (a stack with a server is made for each of the stack tests: one of them; attachments are the
# lab's e2e tests' and openstacksdk's compute suite's)
_SDK_MORE_CI = (
    Group(SDK, "openstack.tests.functional.object_store", service="object-store"),
    Group(
        SDK,
        "openstack.tests.functional.orchestration.v1.test_stack",
        ("TestStack::test_list",),
        service="orchestration",
    ),
    *(
        Group(SDK, f"openstack.tests.functional.block_storage.v3.{module}", service="block-storage")
        for module in (
            "test_volume",
            "test_snapshot",
            "test_availability_zone",
            "test_type",
            "test_limits",
        )
    ),
)

# Each kind of request once, the cheapest test of it: a python-openstackclient test costs a CLI
# process per command (its endpoint tests took 125 s a mode, application credentials 52, a
# server 45, objects 36, flavors 32; openstacksdk's suites, the e2e tests and Tempest make
# those requests in every mode anyway).
_OSC_CI = (
    Group(OSC, "openstackclient.tests.functional.identity.v3.test_token", ("TokenTests",)),
    Group(OSC, "openstackclient.tests.functional.identity.v3.test_catalog", ("CatalogTests",)),
    # the service life cycle: a service type the federation does not know is in the catalog
    Group(OSC, "openstackclient.tests.functional.identity.v3.test_service"),
    Group(
        OSC,
        "openstackclient.tests.functional.identity.v3.test_project",
        ("ProjectTests::test_project_list", "ProjectTests::test_project_show"),
    ),
    Group(OSC, "openstackclient.tests.functional.identity.v3.test_access_rule"),
    Group(
        OSC,
        "openstackclient.tests.functional.image.v2.test_image",
        (
            "ImageTests::test_image_list",
            "ImageTests::test_image_list_with_name_filter",
            "ImageTests::test_image_set_rename",
        ),
    ),
    Group(
        OSC,
        "openstackclient.tests.functional.compute.v2.test_keypair",
        ("KeypairTests::test_keypair_create", "KeypairTests::test_keypair_list"),
    ),
    Group(OSC, "openstackclient.tests.functional.common.test_versions"),
    Group(OSC, "openstackclient.tests.functional.common.test_availability_zone"),
    Group(
        OSC, "openstackclient.tests.functional.common.test_quota", ("QuotaTests::test_quota_show",)
    ),
)

_OSC_MORE_CI = (
    Group(OSC, "openstackclient.tests.functional.object.v1.test_container", service="object-store"),
    Group(
        OSC,
        "openstackclient.tests.functional.volume.v3.test_volume",
        ("VolumeTests::test_volume_list",),
        service="block-storage",
    ),
)

# Tempest: the interop guideline's required tests (tempest-interop.txt), by service.
_TEMPEST_FULL = (
    Group(TEMPEST, "tempest.api.identity", listed=True, service="identity"),
    Group(TEMPEST, "tempest.api.image", listed=True, service="image"),
    Group(TEMPEST, "tempest.api.compute", listed=True, service="compute"),
    Group(TEMPEST, "tempest.api.object_storage", listed=True, service="object-store"),
    Group(TEMPEST, "tempest.api.volume", listed=True, service="block-storage"),
)

_TEMPEST_CI = (
    Group(TEMPEST, "tempest.api.identity", listed=True, service="identity"),
    Group(TEMPEST, "tempest.api.image", listed=True, service="image"),
    Group(
        TEMPEST,
        "tempest.api.compute",
        (
            "flavors",
            "keypairs",
            "servers.test_availability_zone",
            "servers.test_create_server",
            "servers.test_instance_actions",
            "servers.test_servers_negative",
            "servers.test_server_tags",
            "test_versions",
        ),
        listed=True,
        service="compute",
    ),
    Group(
        TEMPEST,
        "tempest.api.object_storage",
        (
            "test_account_quotas",
            "test_account_quotas_negative",
            "test_account_services",
            "test_container_acl",
            "test_container_quotas",
            "test_container_services",
            "test_object_services",
            "test_object_slo",
            "test_object_temp_url",
            "test_object_version",
        ),  # all but the object expiry's wait
        listed=True,
        service="object-store",
    ),
    Group(
        TEMPEST,
        "tempest.api.volume",
        (
            "test_availability_zone",
            "test_extensions",
            "test_versions",
            "test_volume_metadata",
            "test_volumes_get",
            "test_volumes_list",
            "test_volumes_negative",
        ),
        listed=True,
        service="block-storage",
    ),
)

# Tests never started (pytest --deselect) because they wait for what the lab cannot do, up to a
# timeout far beyond any budget; each fails in every mode, and docs/lab/openstack-suites.md lists
# it.
NOT_RUN: dict[str, str] = {
    "openstack/tests/functional/cloud/test_compute.py::TestCompute::"
    "test_create_image_snapshot_wait_active": "nova's fake virt driver never uploads a "
    "snapshot's data, so the image stays queued (the test waits an hour for it)",
}

SELECTIONS: dict[str, tuple[Group, ...]] = {
    "ci": _SDK_CI + _SDK_MORE_CI + _OSC_CI + _OSC_MORE_CI + _TEMPEST_CI,
    "full": _SDK_FULL + _SDK_MORE_FULL + _OSC_FULL + _OSC_MORE_FULL + _TEMPEST_FULL,
}
