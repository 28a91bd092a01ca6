"""playbooks/federation.yml applied for real to the lab's clouds (issue 10's acceptance).

Needs a lab started without routers (`scoperouter lab up --no-router`: the catalogs point
straight at the services) at $SCOPEROUTER_LAB_DIR, and root. The playbook runs on this machine
(`ansible_connection=local`, one inventory host per cloud, the router role's plain mode: PID 1
is not systemd here) and must:

* generate the federation config from both clouds' live endpoint lists, make the router user
  and application credentials, start a router per cloud, point each keystone's public endpoints
  at its router and give the clouds' services `HTTP_PROXY` through systemd-style drop-ins (the
  lab's services are not systemd units: the lab reads the same drop-ins, `<lab>/systemd/
  <process>.service.d/*.conf`, and `scoperouter lab restart` applies them);
* give every router a TLS peer link by default: a federation CA made once on the controller
  (this machine, beside the inventory), a certificate for each router's address signed by it
  (its key mode 0600, the router's user's, never in Ansible's output), `settings.peers.ca`;
* then the scope e2e checks pass against the federation it built (tests/e2e/test_workflow.py:
  an image of CloudTwo listed and a server booted from it through CloudOne's router, compute in
  CloudTwo for a CloudOne user), pointed at it with SCOPEROUTER_E2E_CLOUDS_YAML, and every hop
  from one router to the other during them went to the other's https peer link (the routers'
  access lines, as tests/e2e/test_peer_tls.py reads the lab's), which presents a certificate
  that a client trusting only the controller's CA accepts for that address;
* a second run and a `--check --diff` run change nothing (no certificate made again, no router
  restarted); the drop-ins pass `systemd-analyze verify`;
* `-e state=absent` puts every endpoint back exactly as it was (compared with the list read
  before), removes the drop-ins (the services run without HTTP_PROXY again), stops the routers,
  deletes the router user and removes the peer links' files (the routers' and the controller's).

On a TLS lab (`lab up --no-router --tls`: every endpoint https with the lab's CA, issue 22)
the playbook takes the TLS clouds' way (docs/deploying/federation.md, "TLS clouds"), and the
test checks it too: https frontends with a certificate of the federation's CA, an interception
CA per cloud (key 0600, the router's user's) named by `proxy`, `HTTPS_PROXY` and
`REQUESTS_CA_BUNDLE` in the drop-ins, the CA in the services' trust (the trust-anchor directory
and its update command, here a scratch directory and a `cat` that builds the bundle the
drop-ins name, where a host runs update-ca-certificates), the routers' credentials verifying the
other router's https frontend (`cacert`), the upstreams verified with the lab's CA
(`scoperouter_federation_overrides`); the e2e checks then pass with nova's https calls to glance
intercepted by CloudOne's router; `state=absent` removes all of it.

Run with `SCOPEROUTER_FEDERATION_LAB=1 pytest -m deploy tests/deploy/test_federation.py`
(without the variable it skips: the lab it needs is not the routed one of the e2e suite);
`.ci/run` runs it in its own step, on the lab brought up again with --no-router. The routers
run from a virtualenv the fixture makes with this checkout installed (the role's pip task finds
it there): tests/deploy/test_router_role.py covers the role's own installation.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter import __version__
from tests.ci import missing
from tests.deploy.ansible import (
    PLAYBOOKS,
    REPO,
    changed,
    deploy_tool,
    local_role_vars,
    run_playbook,
    scratch_dir,
    systemd_verify,
    unchanged,
)

pytestmark = pytest.mark.deploy

E2E_SELECTION = (
    "image_list_follows_the_scope or server_in_cloudone_from_an_image_of_cloudtwo"
    " or compute_in_cloudtwo_with_a_cloudone_user"
)
E2E_COUNT = 6
ROUTER_USER = "scoperouter-router"
PEER_PORT = 9443  # the role's default peer link port (scoperouter_federation_peer_port)


def _unavailable(reason: str) -> None:
    """No lab to federate: a skip, unless asked for (.ci/run's federation step sets
    SCOPEROUTER_FEDERATION_LAB=1 after `lab up --no-router`) or under CI=true: then a
    failure."""
    if os.environ.get("SCOPEROUTER_FEDERATION_LAB") == "1":
        pytest.fail(reason, pytrace=False)
    missing(reason)


@dataclass
class Federation:
    lab_root: Path
    base: Path
    inventory: Path
    clouds: list[Any]  # scoperouter_lab.layout.CloudSpec
    admin_passwords: dict[str, str]
    before: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    links: list[Path] = field(default_factory=list)
    set_aside: list[tuple[Path, Path]] = field(default_factory=list)  # (where now, original)
    undone: bool = False  # state=absent ran and passed its checks
    pids: dict[str, int] = field(default_factory=dict)  # the lab's services, before a run
    tls: bool = False  # a TLS lab (`lab up --tls`): the TLS clouds' way

    @property
    def lab_ca(self) -> Path:
        """The lab's CA as the routers read it: a copy in the scratch dir (the lab's own may
        be under a home of mode 0700, as CI's is: ~/.local/share/scoperouter/lab, which the
        routers' users cannot reach)."""
        return readable_lab_ca(self.base)

    @property
    def anchors(self) -> Path:
        """The trust-anchor directory the playbook writes the interception CAs into."""
        return self.base / "anchors"

    @property
    def trust_bundle(self) -> Path:
        """What the trust update command builds from the anchors (and the lab's CA): the
        services' REQUESTS_CA_BUNDLE."""
        return self.base / "trust.pem"

    def check_proxy(self, cloud: Any, proxy: str | None) -> None:
        """Each service of `cloud` was restarted since `pids` was taken, and runs with
        HTTP_PROXY = `proxy` (None: without) where its environment can be read."""
        readable = 0
        for process in PROXIED:
            name = f"{cloud.slug}-{process}"
            assert self.process_pid(name) != self.pids[name], f"{name} was not restarted"
            env = self.process_env(name)
            if "PATH" in env:  # not written over by a process title (uWSGI leaves scraps)
                readable += 1
                assert env.get("HTTP_PROXY") == proxy, name
                if self.tls:  # their https calls too, trusting the interception CA
                    assert env.get("HTTPS_PROXY") == proxy, name
                    bundle = str(self.trust_bundle) if proxy else None
                    lab_bundle = str(self.lab_root / "pki" / f"{cloud.slug}-trust.pem")
                    assert env.get("REQUESTS_CA_BUNDLE") == (bundle or lab_bundle), name
        assert readable >= 2, "no service's environment could be read"

    def take_pids(self) -> None:
        self.pids = {
            f"{c.slug}-{p}": self.process_pid(f"{c.slug}-{p}") for c in self.clouds for p in PROXIED
        }

    def run(self, *extra: str) -> str:
        env = {
            **{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
            # both clouds' hosts are this machine, run in parallel; modules run without copies
            "ANSIBLE_FORKS": "2",
            "ANSIBLE_PIPELINING": "1",
        }
        if self.tls:  # the uri module's calls to the keystones (https, the lab's CA)
            env["SSL_CERT_FILE"] = str(self.lab_ca)
        return run_playbook(
            "federation.yml", self.inventory, *extra, env=env, timeout=2400, tail=8000
        )

    def keystone(self, cloud: Any) -> Any:
        from scoperouter_lab.api import Keystone

        url = cloud.backend_endpoint("identity")
        return Keystone(url, "admin", self.admin_passwords[cloud.slug]).login()

    def endpoints(self, cloud: Any) -> list[dict[str, Any]]:
        keys = ("id", "service_id", "interface", "region_id", "url", "enabled")
        rows = self.keystone(cloud).call("GET", "/endpoints")["endpoints"]
        return sorted(({k: row.get(k) for k in keys} for row in rows), key=lambda r: r["id"])

    def etc(self, cloud: Any) -> Path:
        return self.base / f"etc-{cloud.slug}"

    def ctl(self, cloud: Any) -> Path:
        return self.etc(cloud) / f"scoperouter-{cloud.slug}-ctl"

    def pid(self, cloud: Any) -> str:
        return (self.base / f"run-{cloud.slug}" / f"scoperouter-{cloud.slug}.pid").read_text()

    @property
    def pki(self) -> Path:
        """The controller's PKI directory (the role's default: beside the inventory)."""
        return self.base / "scoperouter-pki"

    def peer_url(self, cloud: Any) -> str:
        return f"https://{cloud.front_ip}:{PEER_PORT}"

    def router_log(self, cloud: Any) -> Path:
        return self.base / f"log-{cloud.slug}" / f"scoperouter-{cloud.slug}.log"

    def dropin(self, process: str) -> Path:
        return self.lab_root / "systemd" / f"{process}.service.d" / "scoperouter.conf"

    def process_pid(self, process: str) -> int:
        from scoperouter_lab.procs import ProcessTable

        rec = ProcessTable(self.lab_root / "run").get(process)
        assert rec is not None and rec.alive(), f"lab process {process} is not running"
        return int(rec.pid)

    def process_env(self, process: str) -> dict[str, str]:
        pid = self.process_pid(process)
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def readable_lab_ca(base: Path) -> Path:
    """Where the routers find the lab's CA (see :attr:`Federation.lab_ca`)."""
    return base / "lab-ca.crt"


def _router_venv(base: Path) -> Path:
    """The routers' virtualenv: this checkout installed with the system Python (the service
    user cannot use a Python under /root, e.g. pyenv's). $SCOPEROUTER_FEDERATION_VENV names one
    made beforehand (where pip cannot reach an index, e.g. in a network namespace)."""
    given = os.environ.get("SCOPEROUTER_FEDERATION_VENV")
    if given:
        return Path(given)
    venv = base / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=300)
    # with the router extra the role asks for: both hosts of the inventory are this machine and
    # share this venv, so the role's pip task must find everything installed (two pips
    # installing into one venv at once race: one uninstalls what the other is importing)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{REPO}[router]"],
        check=True,
        timeout=900,
        # pure (setup.py compiles nothing), as tests.deploy.ansible.wheelhouse's: the subject
        # is the playbook; the compile cost 82 s of this step against 14 s (Debian's 3.11)
        env={**os.environ, "SCOPEROUTER_BUILD": "pure"},
    )
    return venv


def _access_lines(log: Path) -> list[dict[str, Any]]:
    """A router's access log lines (one JSON object per request)."""
    return [
        json.loads(line)
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("{") and '"scoperouter.access"' in line
    ]


def _router_account(cloud: Any) -> str:
    """The system user and group of a cloud's router, made by the role (dp-: this test's)."""
    return f"dp-router-{cloud.slug}"


# uWSGI and setproctitle (nova's daemons) write process titles over the environment block, so
# /proc/<pid>/environ of most services reads empty: every service must have been restarted, and
# the environment is checked where it can be read (the lab's stand-ins at least); the e2e checks
# show that glance's and nova's calls reach the router.
PROXIED = ("glance", "placement", "nova-api", "nova-conductor", "nova-scheduler", "nova-compute",
           "network", "block-storage")  # fmt: skip


@pytest.fixture(scope="module")
def fed() -> Iterator[Federation]:
    if os.environ.get("SCOPEROUTER_FEDERATION_LAB") != "1":
        # under CI=true a failure: .ci/run runs it in its own step, and deselects it elsewhere
        missing("needs a lab up with --no-router: SCOPEROUTER_FEDERATION_LAB=1 (.ci/run)")
    if os.geteuid() != 0:
        _unavailable("the playbook creates a system user and writes as root: run as root")
    try:
        from scoperouter_lab.layout import CloudSpec, default_dir
    except ImportError:
        _unavailable("the lab package is not installed (pip install -e ./lab)")
    lab_root = default_dir()
    state_file = lab_root / "lab.json"
    status = subprocess.run(
        [sys.executable, "-m", "scoperouter_lab", "status", "--dir", str(lab_root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not state_file.exists() or status.returncode != 0:
        _unavailable(f"no healthy lab in {lab_root}: scoperouter lab up --no-router")
    state = json.loads(state_file.read_text())
    if state.get("routed") or state.get("clouds", 0) < 2:
        _unavailable(f"the lab in {lab_root} has routers or fewer than 2 clouds: this test needs "
                     "`scoperouter lab up --no-router` (2 clouds)")  # fmt: skip
    tls = bool(state.get("tls"))
    clouds = [CloudSpec(i, tls=tls) for i in range(1, state["clouds"] + 1)]
    if tls:
        from scoperouter_lab import api

        api.trust(lab_root / "pki" / "ca.crt")  # the keystones' https
    base = scratch_dir("fed")
    venv = _router_venv(base)
    groups = {}
    for cloud in clouds:
        host_vars = {
            **local_role_vars("scoperouter", base, f"-{cloud.slug}"),
            # both routers run on this one machine: each its own user (one user would have
            # two homes, and every run would move it from one to the other under the router)
            "scoperouter_user": _router_account(cloud),
            "scoperouter_group": _router_account(cloud),
            "scoperouter_cloud": cloud.name,
            "scoperouter_federation_keystone": {
                "auth_url": cloud.backend_endpoint("identity"),
                "username": "admin",
                "password": state["cloud_secrets"][cloud.slug]["admin"],
                "project_name": "admin",
                "user_domain_name": "Default",
                "project_domain_name": "Default",
            },
            "scoperouter_federation_router_host": cloud.front_ip,
            "scoperouter_federation_proxy_units": [f"{cloud.slug}-{p}.service" for p in PROXIED],
        }
        groups[cloud.slug] = {"hosts": {f"dp-{cloud.slug}": host_vars}}
    common = {
        # a venv where this checkout is installed: the role's pip task finds it there
        "scoperouter_package": f"scoperouter[router]=={__version__}",
        "scoperouter_venv": str(venv),
        # the lab's stand-in for /etc/systemd/system, and its stand-in for systemctl restart
        "scoperouter_federation_systemd_dir": str(lab_root / "systemd"),
        "scoperouter_federation_restart_command": [
            sys.executable,
            "-m",
            "scoperouter_lab",
            "restart",
            "--dir",
            str(lab_root),
        ],
        "scoperouter_federation_state_dir": str(base / "state"),
    }
    if tls:
        anchors, bundle = base / "anchors", base / "trust.pem"
        lab_ca = readable_lab_ca(base)
        shutil.copyfile(lab_root / "pki" / "ca.crt", lab_ca)
        lab_ca.chmod(0o644)
        # a host's update-ca-certificates, here: the bundle of the lab's CA (the services'
        # own) and the anchors, replaced at once (both clouds' hosts run it, in parallel)
        update = (f'tmp=$(mktemp {base}/trust.XXXXXX) && cat {lab_ca} {anchors}/*.crt > "$tmp" '
                  f'2>/dev/null; chmod 644 "$tmp" && mv "$tmp" {bundle}')  # fmt: skip
        common.update(
            {
                "scoperouter_federation_trust_anchor_dir": str(anchors),
                "scoperouter_federation_trust_update": ["sh", "-c", update],
                "scoperouter_federation_ca_bundle": str(bundle),
                # the routers verify the clouds' https services with the lab's CA
                "scoperouter_federation_overrides": {"settings": {"ca_bundle": str(lab_ca)}},
            }
        )
    inventory = base / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"scoperouter_federation": {"children": groups, "vars": common}}}}
        )
    )
    federation = Federation(
        lab_root=lab_root,
        base=base,
        inventory=inventory,
        clouds=clouds,
        admin_passwords={c.slug: state["cloud_secrets"][c.slug]["admin"] for c in clouds},
        tls=tls,
    )
    if tls:
        federation.anchors.mkdir(mode=0o755)
    federation.before = {c.name: federation.endpoints(c) for c in clouds}
    try:
        yield federation
    finally:
        for link in federation.links:
            link.unlink(missing_ok=True)
        for aside, original in federation.set_aside:
            aside.replace(original)
        if not federation.undone and any(federation.ctl(c).exists() for c in clouds):
            subprocess.run(  # a failed test left the federation up: undo it (best effort)
                [deploy_tool("ansible-playbook"), "-i", str(inventory), "federation.yml",
                 "-e", "state=absent"],
                cwd=PLAYBOOKS, check=False, timeout=1200, capture_output=True,
            )  # fmt: skip
        for cloud in clouds:
            if federation.ctl(cloud).exists():
                subprocess.run([str(federation.ctl(cloud)), "stop"], check=False, timeout=60)
            subprocess.run(["userdel", _router_account(cloud)], check=False, capture_output=True)
            subprocess.run(["groupdel", _router_account(cloud)], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _secrets(fed: Federation) -> list[str]:
    found = list(fed.admin_passwords.values())
    for cloud in fed.clouds:
        secure = fed.etc(cloud) / "secure.yaml"
        if secure.exists():
            for entry in yaml.safe_load(secure.read_text())["clouds"].values():
                found.append(entry["auth"]["application_credential_secret"])
    return found


def _keys(fed: Federation) -> list[str]:
    """The body of every private key of the peer links (the CA's, each router's), as a line
    of base64 that would show in any output that printed the key."""
    keys = [fed.pki / "ca.key", *(fed.etc(c) / "peer.key" for c in fed.clouds)]
    return ["".join(path.read_text().splitlines()[1:-1]) for path in keys]


def _peer_certificate(fed: Federation, cloud: Any) -> dict[str, Any]:
    """The certificate the router's peer link presents to a client that trusts only the
    controller's CA and checks the link's address against it (as the other router does)."""
    context = ssl.create_default_context(cafile=str(fed.pki / "ca.crt"))
    with (
        socket.create_connection((cloud.front_ip, PEER_PORT), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=cloud.front_ip) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return cert


def _check_tls_present(
    fed: Federation, cloud: Any, config: dict[str, Any], entries: dict[str, Any]
) -> None:
    """A TLS cloud's part of the present state: the router's https frontends (a certificate of
    the federation's CA for its address), its forward proxy's interception CA (key 0600, the
    router's user's), that CA among the services' trust anchors and in the bundle their
    drop-ins name."""
    etc = fed.etc(cloud)
    mine = config["clouds"][cloud.name]
    assert mine["proxy"] == {"listen": cloud.proxy_listen, "ca": str(etc / "proxy-ca.crt"),
                             "ca_key": str(etc / "proxy-ca.key")}  # fmt: skip
    assert mine["frontends"] and all(f["url"].startswith("https://") for f in mine["frontends"])
    for front in mine["frontends"]:
        assert front["tls"] == {"cert": str(etc / "frontend.crt"), "key": str(etc / "frontend.key")}
    for key in (etc / "proxy-ca.key", etc / "frontend.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
        assert key.stat().st_uid == pwd.getpwnam(_router_account(cloud)).pw_uid, key
    proxy_ca = (etc / "proxy-ca.crt").read_bytes()
    assert proxy_ca == (fed.pki / f"{cloud.slug}-proxy-ca.crt").read_bytes()
    anchor = fed.anchors / f"scoperouter-{cloud.slug}-proxy-ca.crt"
    assert anchor.read_bytes().strip() == proxy_ca.strip()
    assert proxy_ca.strip() in fed.trust_bundle.read_bytes()
    # the frontend presents a certificate of the federation's CA for the router's address
    context = ssl.create_default_context(cafile=str(fed.pki / "ca.crt"))
    with (
        socket.create_connection((cloud.front_ip, 5000), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=cloud.front_ip) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None and cert["subjectAltName"] == (("IP Address", cloud.front_ip),)


def test_present_federates_the_clouds(fed: Federation) -> None:
    fed.take_pids()
    output = fed.run("--diff", "-v")
    assert changed(output) > 0
    secrets = _secrets(fed)
    assert len(secrets) == 2 * len(fed.clouds)  # admin passwords, one credential per peer
    leaked = [s for s in secrets if s in output]
    assert not leaked, "a secret reached Ansible's output"
    flat = output.replace("\n", "").replace("\\n", "")
    assert not [k for k in _keys(fed) if k[:40] in flat], "a key reached Ansible's output"
    assert (fed.pki / "ca.key").stat().st_mode & 0o777 == 0o600
    for cloud in fed.clouds:
        # the public endpoints point at the router, on the same ports and paths; the others
        # (none in the lab) and every id stay as they were
        now = {e["id"]: e for e in fed.endpoints(cloud)}
        assert set(now) == {e["id"] for e in fed.before[cloud.name]}
        for old in fed.before[cloud.name]:
            want = old["url"]
            if old["interface"] == "public" and old["region_id"] == cloud.region:
                want = want.replace(f"//{cloud.back_ip}:", f"//{cloud.front_ip}:")
            assert now[old["id"]] == {**old, "url": want}
        # the router runs as its own user; its credentials are application credentials of the
        # other cloud (no password anywhere), secrets only in secure.yaml (0600)
        status = subprocess.run([str(fed.ctl(cloud)), "status"], capture_output=True, text=True)
        assert status.returncode == 0, status.stdout
        entries = yaml.safe_load((fed.etc(cloud) / "clouds.yaml").read_text())["clouds"]
        others = [c for c in fed.clouds if c != cloud]
        assert set(entries) == {f"router-at-{c.slug}" for c in others}
        for other in others:
            entry = entries[f"router-at-{other.slug}"]
            assert entry["auth_type"] == "v3applicationcredential"
            assert entry["auth"]["auth_url"] == other.endpoint_url("identity", True)
            assert set(entry["auth"]) == {"auth_url", "application_credential_id"}
            # a TLS cloud's identity URL is the other router's https frontend (federation CA)
            want = str(fed.etc(cloud) / "federation-ca.crt") if fed.tls else None
            assert entry.get("cacert") == want
        assert (fed.etc(cloud) / "secure.yaml").stat().st_mode & 0o777 == 0o600
        config = yaml.safe_load((fed.etc(cloud) / "federation.yaml").read_text())
        if fed.tls:
            _check_tls_present(fed, cloud, config, entries)
        else:
            assert config["clouds"][cloud.name]["proxy"] == {"listen": cloud.proxy_listen}
        # a TLS peer link for every router, verified with the federation's CA; the files as
        # this router's host has them (each router reads its own; one path for every cloud);
        # the key is the router's alone
        assert config["settings"]["peers"] == {"ca": str(fed.etc(cloud) / "federation-ca.crt")}
        assert config["settings"].get("ca_bundle") == (str(fed.lab_ca) if fed.tls else None)
        assert config["settings"].get("verify", True) is True
        for each in fed.clouds:
            assert config["clouds"][each.name]["peer"] == {
                "url": fed.peer_url(each),
                "tls": {"cert": str(fed.etc(cloud) / "peer.crt"),
                        "key": str(fed.etc(cloud) / "peer.key")},
            }  # fmt: skip
        key = (fed.etc(cloud) / "peer.key").stat()
        assert key.st_mode & 0o777 == 0o600
        assert key.st_uid == pwd.getpwnam(_router_account(cloud)).pw_uid
        ca = (fed.etc(cloud) / "federation-ca.crt").read_bytes()
        assert ca == (fed.pki / "ca.crt").read_bytes()
        presented = _peer_certificate(fed, cloud)
        assert presented["subjectAltName"] == (("IP Address", cloud.front_ip),)
        assert config["clouds"][cloud.name]["credentials"] == {
            o.name: f"router-at-{o.slug}" for o in others
        }
        # the services call through their router: their drop-in is applied
        fed.check_proxy(cloud, f"http://{cloud.proxy_listen}")
        # the router user holds the service role on its own project, and nothing else
        ks = fed.keystone(cloud)
        users = ks.call("GET", f"/users?name={ROUTER_USER}")["users"]
        assert len(users) == 1
        assignments = ks.call("GET", f"/role_assignments?user.id={users[0]['id']}&include_names")
        held = {(a["role"]["name"], a["scope"]["project"]["name"])
                for a in assignments["role_assignments"]}  # fmt: skip
        assert held == {("service", ROUTER_USER)}


def test_scope_e2e_checks_pass_through_the_playbooks_routers(fed: Federation) -> None:
    # the lab's clouds.yaml, entering each cloud at its router as the catalog now says
    lab_clouds = yaml.safe_load((fed.lab_root / "clouds.yaml").read_text())
    for entry in lab_clouds["clouds"].values():
        for cloud in fed.clouds:
            auth = entry["auth"]
            auth["auth_url"] = auth["auth_url"].replace(
                f"//{cloud.back_ip}:", f"//{cloud.front_ip}:"
            )
    if fed.tls:
        # the routers' https frontends: the federation's CA; the lab's services: the lab's
        client_ca = fed.base / "client-ca.pem"
        client_ca.write_bytes(fed.lab_ca.read_bytes() + (fed.pki / "ca.crt").read_bytes())
        for entry in lab_clouds["clouds"].values():
            entry["cacert"] = str(client_ca)
    clouds_yaml = fed.base / "clouds.yaml"
    clouds_yaml.write_text(yaml.safe_dump(lab_clouds))
    clouds_yaml.chmod(0o600)
    # the e2e tests read each router's log where the lab keeps it; a routed lab that ran
    # before (CI's e2e step) left its own router's log there: set aside while the test runs
    for cloud in fed.clouds:
        link = fed.lab_root / "logs" / cloud.name / "router.log"
        if link.exists() or link.is_symlink():
            aside = link.with_name("router.log.before-federation-test")
            link.replace(aside)
            fed.set_aside.append((aside, link))
        link.symlink_to(fed.router_log(cloud))
        fed.links.append(link)
    env = {
        **os.environ,
        "SCOPEROUTER_LAB_REUSE": "1",
        "SCOPEROUTER_E2E_CLOUDS_YAML": str(clouds_yaml),
        "SCOPEROUTER_LAB_DIR": str(fed.lab_root),
    }
    argv = [sys.executable, "-m", "pytest", "-m", "e2e", "-p", "no:cacheprovider", "-q",
            "tests/e2e/test_workflow.py", "-k", E2E_SELECTION]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    assert f"{E2E_COUNT} passed" in output, output[-3000:]
    # every hop from one router to the other (the CLI's calls, nova's and glance's through the
    # forward proxies, token validations) went to the other's TLS peer link, and arrived there
    deadline = time.monotonic() + 10  # access lines are written in batches (<= 0.5 s late)
    while True:
        lines = {c.name: _access_lines(fed.router_log(c)) for c in fed.clouds}
        hops = {n: [e for e in found if e["decision"] == "remote"] for n, found in lines.items()}
        ids = {n: {e["request_id"] for e in found} for n, found in lines.items()}
        missing = [
            h
            for n, sent in hops.items()
            for h in sent
            if h["status"] < 500 and h["request_id"] not in ids[h["cloud"]]
        ]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, f"hops that never arrived: {missing[:3]}"
    if fed.tls:
        # nova's https calls to glance went through CloudOne's forward proxy, intercepted
        # (their URL https://) and routed to CloudTwo by the scope
        one, two = fed.clouds[0], fed.clouds[1]
        intercepted = [
            e
            for e in lines[one.name]
            if e["path"].startswith(f"https://{one.front_ip}:9292/v2/images/")
            and e["cloud"] == two.name
        ]
        assert intercepted and all(e["status"] == 200 for e in intercepted), intercepted[:3]
    for cloud in fed.clouds:
        assert hops[cloud.name], f"{cloud.name}'s router sent no hop to the other router"
        for hop in hops[cloud.name]:
            other = next(c for c in fed.clouds if c.name == hop["cloud"])
            assert hop["target"].startswith(fed.peer_url(other) + "/"), hop


def test_second_run_and_check_mode_change_nothing(fed: Federation) -> None:
    pids = [
        (fed.base / f"run-{c.slug}" / f"scoperouter-{c.slug}.pid").read_text() for c in fed.clouds
    ]
    made = {p.name: p.read_bytes() for p in fed.pki.iterdir()}
    unchanged(fed.run())
    unchanged(fed.run("--check", "--diff"))
    after = [
        (fed.base / f"run-{c.slug}" / f"scoperouter-{c.slug}.pid").read_text() for c in fed.clouds
    ]
    assert after == pids  # no router restarted
    assert {p.name: p.read_bytes() for p in fed.pki.iterdir()} == made  # nothing made again


def test_dropins_pass_systemd_analyze(fed: Federation, tmp_path: Path) -> None:
    cloud = fed.clouds[0]
    for process in PROXIED:
        unit = f"{cloud.slug}-{process}.service"
        # the drop-in beside a unit that stands for the service's own (another package's)
        (tmp_path / unit).write_text(
            f"[Unit]\nDescription={unit}\n[Service]\nExecStart=/bin/true\n"
        )
        shutil.copytree(fed.dropin(f"{cloud.slug}-{process}").parent, tmp_path / f"{unit}.d")
        output = systemd_verify(unit, unit_path=tmp_path)
        assert "scoperouter.conf" not in output  # no warning about it
        dropin = fed.dropin(f"{cloud.slug}-{process}").read_text()
        assert f'"HTTP_PROXY=http://{cloud.proxy_listen}"' in dropin
        assert (f'"HTTPS_PROXY=http://{cloud.proxy_listen}"' in dropin) == fed.tls
        assert (f'"REQUESTS_CA_BUNDLE={fed.trust_bundle}"' in dropin) == fed.tls


def test_absent_restores_the_clouds(fed: Federation) -> None:
    fed.take_pids()
    output = fed.run("-e", "state=absent")
    assert changed(output) > 0
    for cloud in fed.clouds:
        assert fed.endpoints(cloud) == fed.before[cloud.name]  # exactly as before
        for process in PROXIED:
            assert not fed.dropin(f"{cloud.slug}-{process}").parent.exists()
        fed.check_proxy(cloud, None)
        status = subprocess.run([str(fed.ctl(cloud)), "status"], capture_output=True, text=True)
        assert status.returncode == 3 and "stopped" in status.stdout
        assert not (fed.etc(cloud) / "secure.yaml").exists()
        for name in ("peer.key", "peer.crt", "federation-ca.crt", "frontend.crt", "frontend.key",
                     "proxy-ca.crt", "proxy-ca.key"):  # fmt: skip
            assert not (fed.etc(cloud) / name).exists(), name
        if fed.tls:  # out of the services' trust again
            assert not (fed.anchors / f"scoperouter-{cloud.slug}-proxy-ca.crt").exists()
            assert fed.trust_bundle.read_bytes() == fed.lab_ca.read_bytes()
        ks = fed.keystone(cloud)
        assert ks.call("GET", f"/users?name={ROUTER_USER}")["users"] == []
        assert ks.call("GET", f"/projects?name={ROUTER_USER}")["projects"] == []
    assert not list((fed.base / "state").glob("*.json"))
    assert not fed.pki.exists()  # the CA the role made, the routers' certificates and keys
    fed.undone = True
    unchanged(fed.run("-e", "state=absent"))
