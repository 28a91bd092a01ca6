"""The samples in config/ work: the federation loads (conftest) and the router's clouds.yaml
loads with openstacksdk's own loader, secrets merged from the secure.yaml beside it."""

from __future__ import annotations

from pathlib import Path

from openstack import config as os_config

from scoperouter.catalog import Catalog

CONFIG = Path(__file__).resolve().parents[2] / "config"


def test_router_clouds_yaml_sample_loads_with_secrets_merged() -> None:
    loader = os_config.OpenStackConfig(
        config_files=[str(CONFIG / "router-clouds.yaml")],
        secure_files=[str(CONFIG / "router-secure.yaml")],
        load_envvars=False,
    )
    region = loader.get_one(cloud="router-at-cloudtwo", validate=False)
    assert region.config["auth_type"] == "v3applicationcredential"
    assert region.config["auth"]["application_credential_secret"] == "REPLACE-WITH-SECRET"
    assert region.region_name == "CloudTwo"


def test_federation_sample_names_the_router_entries(catalog: Catalog) -> None:
    assert catalog.clouds["CloudOne"].credentials == {"CloudTwo": "router-at-cloudtwo"}
    assert catalog.clouds["CloudTwo"].credentials == {"CloudOne": "router-at-cloudone"}


def test_federation_sample_spells_out_the_defaults(catalog: Catalog) -> None:
    """The sample's settings block documents the defaults: loading it changes nothing."""
    from scoperouter.catalog import Settings

    assert catalog.settings == Settings()
    assert catalog.clouds["CloudOne"].metrics_listen == ("127.0.0.2", 9180)
