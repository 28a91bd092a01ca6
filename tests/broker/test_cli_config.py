"""The broker's config (the sample in config/ loads and builds the real catalog), its refusals,
the operator commands on a real database, and the pure helpers of identity and credentials."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.broker import cli, migrate
from scoperouter.broker.config import (
    BrokerConfigError,
    UserMapping,
    config_from_dict,
    load_config,
)
from scoperouter.broker.credentials import CredentialPolicy, clouds_yaml_entry
from scoperouter.broker.identity import TenancyError, mapped_users, space_of
from scoperouter.broker.runtime import Broker
from scoperouter.broker.secrets import Secrets, SecretsError, generate_key
from scoperouter.cli import main as scoperouter_main
from tests.broker import fakes
from tests.broker.conftest import Harness

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "broker.yaml"


def test_the_sample_config_loads_and_builds_the_catalog() -> None:
    config = load_config(SAMPLE)
    assert config.listen_address == ("127.0.0.1", 8090)
    assert list(config.clouds) == ["CloudOne", "CloudTwo"]
    assert config.database_url({}).startswith("sqlite:////")  # relative to the file
    broker = Broker(config, secrets=Secrets([generate_key()]))
    try:
        by_name = {entry.name: entry for entry in broker.offerings.values()}
        assert set(by_name) == {"openstack-project", "openstack-server", "openstack-image"}
        entry = by_name["openstack-project"]
        assert [p.name for p in entry.plans] == ["standard", "cloudtwo"]
        schema = entry.plans[0].schemas.instance_create
        assert schema is not None
        assert schema["properties"]["cloud"]["enum"] == ["CloudOne", "CloudTwo"]
        assert entry.plans[1].settings["cloud"] == "CloudTwo"
    finally:
        broker.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"auth": {"username": "b", "password": "x"}}, "auth.password: secrets are not read"),
        ({"listen": "nowhere"}, "listen"),
        ({"worker": {"lease_seconds": 5, "heartbeat_seconds": 9}}, "heartbeat_seconds"),
        ({"surprise": 1}, "surprise"),
        (
            {
                "identity": {
                    "users": [
                        {
                            "platform": "p",
                            "match": {"a": "b"},
                            "keystone_user": "u",
                            "clouds": ["Nowhere"],
                        }
                    ]
                }
            },
            "identity.users[0].clouds",
        ),
        ({"services": {"x": {"plugin": "not a path"}}}, "services.x.plugin"),
    ],
)
def test_bad_configs_are_refused_with_the_key_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(BrokerConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_dict(data)


def test_no_password_and_no_keys_is_an_error_not_a_default(tmp_path: Path) -> None:
    config = config_from_dict({})
    with pytest.raises(BrokerConfigError, match="no broker password"):
        config.password({})
    with pytest.raises(BrokerConfigError, match="no secret keys"):
        config.secret_keys({})
    (tmp_path / "pw").write_text("from-file\n")
    (tmp_path / "keys").write_text("# newest first\nk1\nk2\n")
    config = config_from_dict(
        {"auth": {"password_file": "pw"}, "secrets": {"keys_file": "keys"}},
        source=tmp_path / "broker.yaml",
    )
    assert config.password({}) == "from-file"
    assert config.password({"SCOPEROUTER_BROKER_PASSWORD": "env"}) == "env"
    assert config.secret_keys({}) == ["k1", "k2"]
    assert config.secret_keys({"SCOPEROUTER_BROKER_SECRET_KEYS": "a, b"}) == ["a", "b"]


def test_serve_refuses_to_start_without_a_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCOPEROUTER_BROKER_PASSWORD", raising=False)
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump({"database": {"url": f"sqlite:///{tmp_path}/b.db"}}))
    assert scoperouter_main(["broker", "serve", "--config", str(path)]) == 2
    assert "no broker password" in capsys.readouterr().err


def test_secrets_rotation(tmp_path: Path) -> None:
    old, new = generate_key(), generate_key()
    token = Secrets([old]).encrypt({"secret": "s3"})
    both = Secrets([new, old])
    rotated = both.rotate(token)
    assert Secrets([new]).decrypt(rotated) == {"secret": "s3"}
    with pytest.raises(SecretsError, match="cannot be decrypted") as exc:
        Secrets([new]).decrypt(token)
    assert "s3" not in str(exc.value)
    with pytest.raises(SecretsError, match="not a Fernet key"):
        Secrets(["short"])


def _write_config(tmp_path: Path, db_url: str) -> Path:
    path = tmp_path / "cli.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": db_url},
                "services": {
                    "fake": {
                        "plugin": "tests.broker.fakes:FakeService",
                        "state_dir": str(tmp_path / "cloud"),
                    }
                },
            }
        )
    )
    return path


def test_operator_commands(
    harness: Harness,
    db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _write_config(tmp_path, db_url)
    key = _known_key(harness)
    assert cli.main(["db", "upgrade", "--config", str(config)]) == 0
    assert "already current" in capsys.readouterr().out
    harness.provisioned("op-1", {"size": 2})
    assert harness.bind("op-1", "bind-1").status_code == 202
    harness.drain()
    secret = (harness.state_dir / "binding-bind-1").read_text()
    assert harness.provision("op-2", {"steps": 5}).status_code == 202

    assert cli.main(["list", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "op-1" in out and "provisioned" in out and "op-2" in out and "provisioning" in out
    assert cli.main(["list", "--config", str(config), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["id"]: r["bindings"] for r in rows} == {"op-1": 1, "op-2": 0}

    assert cli.main(["show", "--config", str(config), "bind-1", "--json"]) == 0
    shown = capsys.readouterr().out
    data = json.loads(shown)
    assert data["id"] == "op-1" and data["bindings"][0]["has_credentials"] is True
    assert [o["kind"] for o in data["operations"]] == ["provision", "bind"]
    assert secret not in shown
    assert cli.main(["show", "--config", str(config), "op-2"]) == 0
    assert "provision" in capsys.readouterr().out
    assert cli.main(["show", "--config", str(config), "nothing"]) == 1

    # rotate-key: every stored secret re-encrypted with the newest key, still readable
    new_key = generate_key()
    monkeypatch.setenv("SCOPEROUTER_BROKER_SECRET_KEYS", f"{new_key},{key}")
    assert cli.main(["rotate-key", "--config", str(config)]) == 0
    assert "re-encrypted 1 secret" in capsys.readouterr().out
    with harness.broker.store.read() as session:
        binding = harness.broker.store.binding(session, "bind-1")
        assert binding is not None and binding.credentials is not None
        assert Secrets([new_key]).decrypt(binding.credentials)["password"] == secret
    assert cli.main(["rotate-key", "--generate"]) == 0
    assert len(capsys.readouterr().out.strip()) == 44

    # repair: the fake service's inventory matches; then drift both ways
    assert cli.main(["repair", "--config", str(config)]) == 0
    assert "no drift" in capsys.readouterr().out
    (tmp_path / "cloud" / "instance-op-1").unlink()
    (tmp_path / "cloud" / "instance-stray").write_text("{}")
    assert cli.main(["repair", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "orphan: FakeCloud fake fake-stray" in out
    assert "missing: instance op-1" in out
    # one unreachable cloud: the readable one's drift still reported, the other unchecked
    (tmp_path / "cloud" / "down-FakeDown").write_text("")
    assert cli.main(["repair", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "orphan: FakeCloud fake fake-stray" in out and "missing: instance op-1" in out
    assert "unchecked: fake in FakeDown: could not be read (ConnectionError" in out
    # the instance's own cloud unreachable: nothing claimed missing there, never "no drift"
    (tmp_path / "cloud" / "down-FakeCloud").write_text("")
    assert cli.main(["repair", "--config", str(config), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["orphans"] == [] and report["missing"] == [] and report["errors"] == []
    assert [(u["cloud"], u["error"]) for u in report["unchecked"]] == [
        ("FakeCloud", "ConnectionError: FakeCloud unreachable"),
        ("FakeDown", "ConnectionError: FakeDown unreachable"),
    ]
    assert not any(line.startswith("no drift:") for line in report["lines"])
    (tmp_path / "cloud" / "down-FakeCloud").unlink()
    (tmp_path / "cloud" / "down-FakeDown").unlink()
    assert cli.main(["repair", "--config", str(config), "--redrive", "op-2"]) == 0
    assert "due now" in capsys.readouterr().out

    # purge: only gone instances, unless forced
    assert cli.main(["purge", "--config", str(config), "--instance", "op-1"]) == 1
    harness.drain()
    response = harness.deprovision("op-2")
    assert response.status_code == 202
    harness.drain()
    assert cli.main(["purge", "--config", str(config), "--older-than", "0"]) == 0
    assert "forgot 1 instance" in capsys.readouterr().out
    assert harness.provision("op-2", {"steps": 5}).status_code == 202  # the id is free again


def test_repair_counts_what_it_checked_not_the_deprovisioned_rows(
    harness: Harness,
    db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`broker list` says "no instances" while the database keeps deprovisioned rows until
    `purge`: repair's "no drift" counts the live records it compared and what it found."""
    config = _write_config(tmp_path, db_url)
    monkeypatch.setenv("SCOPEROUTER_BROKER_SECRET_KEYS", _known_key(harness))
    for ident in ("gone-1", "gone-2"):
        harness.provisioned(ident)
        assert harness.deprovision(ident).status_code == 202
        harness.drain()
    assert cli.main(["list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "no instances"
    assert cli.main(["repair", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == (
        "no drift: 0 live instance(s) and 0 binding(s) match the 0 tagged resource(s) found "
        "in 1 cloud(s) (FakeCloud)"
    )
    harness.provisioned("live-1")
    assert harness.bind("live-1", "b-1").status_code == 202
    harness.drain()
    assert cli.main(["repair", "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checked"] == {
        "instances": 1,
        "bindings": 1,
        "resources": 2,
        "clouds": ["FakeCloud"],
    }


def _known_key(harness: Harness) -> str:
    """Give the harness's broker a key the test knows, before it stores any secret (Fernet's
    keys cannot be read back: cryptography 51's MultiFernet is Rust, without `_fernets`)."""
    key = generate_key()
    harness.broker.secrets = Secrets([key])
    return key


def test_commands_refuse_an_unmigrated_database(tmp_path: Path, capsys: Any) -> None:
    config = _write_config(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}")
    assert cli.main(["list", "--config", str(config)]) == 2
    assert "db upgrade" in capsys.readouterr().err
    assert cli.main(["db", "upgrade", "--config", str(config)]) == 0
    assert migrate.is_current(f"sqlite:///{tmp_path / 'empty.db'}")


def test_every_broker_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Each command's --help explains it and shows an example of itself."""
    for command in (
        ["serve"],
        ["list"],
        ["show"],
        ["repair"],
        ["purge"],
        ["db", "upgrade"],
        ["rotate-key"],
    ):
        with pytest.raises(SystemExit) as exc:
            scoperouter_main(["broker", *command, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert len(out) > 200
        example = re.search(r"^examples?:\n((?:  .*\n)+)", out, re.M)
        assert example and f"scoperouter broker {' '.join(command)} " in example[1], out


# ------------------------------------------------------------------- pure helpers


def test_space_of_platform_contexts() -> None:
    cf = space_of({"platform": "cloudfoundry", "organization_guid": "o1", "space_guid": "s1"})
    assert cf.parts == (("organization_guid", "o1"), ("space_guid", "s1"))
    assert cf.tag.startswith("osb-space-") and cf.project_name.startswith("osb-cloudfoundry-o1-s1-")
    assert cf == space_of(None, organization_guid="o1", space_guid="s1")
    k8s = space_of({"platform": "kubernetes", "clusterid": "c1", "namespace": "ns"})
    assert k8s.parts == (("clusterid", "c1"), ("namespace", "ns"))
    assert k8s.tag != cf.tag
    crossplane = space_of({"platform": "kubernetes", "clusterId": "c1", "namespace": "ns"})
    assert crossplane == k8s
    with pytest.raises(TenancyError):  # no shared space for requests naming no tenant
        space_of({})


def test_mapped_users_follow_the_table() -> None:
    table = [
        UserMapping(platform="cloudfoundry", match={"user_id": "u1"}, keystone_user="alice"),
        UserMapping(
            platform="kubernetes", match={"username": "bob"}, keystone_user="bob", clouds=("C2",)
        ),
    ]
    cf = {"platform": "cloudfoundry", "value": {"user_id": "u1"}}
    assert [r.keystone_user for r in mapped_users(cf, table, "C1")] == ["alice"]
    k8s = {"platform": "kubernetes", "value": {"username": "bob", "groups": []}}
    assert mapped_users(k8s, table, "C1") == []
    assert [r.keystone_user for r in mapped_users(k8s, table, "C2")] == ["bob"]
    assert mapped_users(None, table, "C1") == []


def test_binding_credentials_document() -> None:
    doc = clouds_yaml_entry(
        name="osb-b1",
        auth_url="http://r/v3",
        region="R",
        credential_id="i",
        secret="s",
        scope={"image": "CloudTwo"},
    )
    entry = doc["clouds"]["osb-b1"]
    assert entry["auth_type"] == "v3applicationcredential"
    assert entry["scope"] == {"image": "CloudTwo"}
    assert entry["vendor_hook"] == "scoperouter.client:connection_hook"
    assert (
        "scope"
        not in clouds_yaml_entry(name="n", auth_url="u", region="r", credential_id="i", secret="s")[
            "clouds"
        ]["n"]
    )
    policy = CredentialPolicy.from_settings({"binding_lifetime": 1000})
    now = datetime(2030, 1, 1, tzinfo=UTC)
    expires, renew = policy.times(now)
    assert expires is not None and renew is not None
    assert (expires - now).total_seconds() == 1000 and (expires - renew).total_seconds() == 200
    assert CredentialPolicy.from_settings({}).times(now) == (None, None)
    assert fakes.SERVICE_ID  # the fake service module stays importable for plugin loading
