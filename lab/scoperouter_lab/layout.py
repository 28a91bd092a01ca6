"""Where everything of a lab lives: names, loopback addresses, ports, files.

Address plan (cloud i = 1, 2, 3 ...):

* the router of cloud i listens on ``127.0.0.(1+i)`` at the standard OpenStack ports (its
  reverse-mode frontends, what the keystone catalog advertises), on ``127.0.0.(1+i):3128``
  (its forward proxy, the ``HTTP_PROXY`` of the cloud's services) and on
  ``https://127.0.0.(1+i):9443`` (its peer link: the other routers' hops, TLS with a
  certificate of the lab's CA, :mod:`scoperouter_lab.pki`) and on ``127.0.0.(1+i):9180``
  (its metrics listener: ``/metrics``, ``/healthz``, the ``/status`` page);
* the real services of cloud i listen on ``127.0.1.(1+i)``, same ports, same paths;
* PostgreSQL and RabbitMQ (one each, shared by all clouds) listen on ``127.0.0.1``.

Same ports and paths on both sides keep version-discovery links right: the router keeps the
``Host`` header, so a service builds links to the frontend the client used.

A TLS lab (``lab up --tls``, :attr:`CloudSpec.tls`) has the same addresses and ports, every
endpoint in https: the services' own (their backend certificates), the routers' frontends
(their frontend certificates), all issued by the lab's CA (:mod:`scoperouter_lab.pki`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CLOUD_WORDS = (
    "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
    "Eleven", "Twelve",
)  # fmt: skip
MAX_CLOUDS = len(CLOUD_WORDS)

# service type -> (backend/frontend port, path of the endpoint URL). Object storage's and
# orchestration's paths end in keystone's substitution of the project id (each token's catalog
# has the project's own URL; the routers match the fixed part, scoperouter.catalog.untemplated).
SERVICE_PORTS: dict[str, tuple[int, str]] = {
    "identity": (5000, "/v3"),
    "image": (9292, ""),
    "compute": (8774, "/v2.1"),
    "placement": (8778, ""),
    "network": (9696, ""),
    "block-storage": (8776, "/v3"),
    "object-store": (8080, "/v1/AUTH_%(project_id)s"),
    "orchestration": (8004, "/v1/%(project_id)s"),
}
# swift's storage servers, on each cloud's backend address (not in the catalog: only the proxy
# reaches them, through the rings)
SWIFT_STORAGE_PORTS = {"object": 6200, "container": 6201, "account": 6202}
# scoperouter's own stand-ins for services the lab does not run (real neutron is heavy):
# process name -> (service type, module, keystone service name). The network stand-in is always
# there; the block-storage one only when cinder is not selected (nova and openstacksdk ask
# block storage about servers: STAND_IN_UNLESS).
STAND_INS: dict[str, tuple[str, str, str]] = {
    "network": ("network", "scoperouter_lab.netstub", "neutron"),
    "block-storage": ("block-storage", "scoperouter_lab.blockstub", "cinder"),
}
STAND_IN_UNLESS = {"block-storage": "cinder"}  # stand-in -> the selected service replacing it
PROXY_PORT = 3128
PEER_PORT = 9443  # each router's peer link (TLS, the lab's CA): the other routers' hops
METRICS_PORT = 9180  # each router's metrics listener: /metrics, /healthz, /status
SHARED_HOST = "127.0.0.1"
POSTGRES_PORT = 5432
RABBIT_PORT = 5672
RABBIT_DIST_PORT = 25672
EPMD_PORT = 4369

# What the user selects with --services, and what each selection needs.
SELECTABLE = ("keystone", "glance", "placement", "nova", "cinder", "swift", "heat")
# what `lab up` runs when neither --services nor a state says: a laptop's lab
DEFAULT_SERVICES = ("keystone", "glance", "placement", "nova")
ALL = "all"  # --services all: every selectable service (what CI runs)
REQUIRES = {
    "keystone": (),
    "glance": ("keystone",),
    "placement": ("keystone",),
    "nova": ("keystone", "glance", "placement"),
    "cinder": ("keystone",),
    "swift": ("keystone",),
    "heat": ("keystone",),
}
# OpenStack service name -> service type in the catalog.
SERVICE_TYPE = {
    "keystone": "identity",
    "glance": "image",
    "placement": "placement",
    "nova": "compute",
    "cinder": "block-storage",
    "swift": "object-store",
    "heat": "orchestration",
    "network": "network",
}
# The long-running processes of each selected service, front (API) first.
PROCESSES: dict[str, tuple[str, ...]] = {
    "keystone": ("keystone",),
    "glance": ("glance",),
    "placement": ("placement",),
    "nova": ("nova-api", "nova-conductor", "nova-scheduler", "nova-compute"),
    "cinder": ("cinder-api", "cinder-scheduler", "cinder-volume"),
    "swift": ("swift-proxy", "swift-account", "swift-container", "swift-object"),
    "heat": ("heat-api", "heat-engine"),
}
# Services that talk over the shared RabbitMQ.
MESSAGING = ("nova", "cinder", "heat")
# Databases per selected service, in the shared PostgreSQL (placement uses SQLite: see
# templates.placement_conf; swift keeps its own SQLite files on its storage).
DATABASES: dict[str, tuple[str, ...]] = {
    "keystone": ("keystone",),
    "glance": ("glance",),
    "placement": (),
    "nova": ("nova_api", "nova_cell0", "nova_cell1"),
    "cinder": ("cinder",),
    "swift": (),
    "heat": ("heat",),
}


def default_dir() -> Path:
    env = os.environ.get("SCOPEROUTER_LAB_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "scoperouter" / "lab"


def resolve_services(text: str | None) -> tuple[str, ...]:
    """``"glance"`` -> ``("keystone", "glance")``, ``"all"`` -> every selectable service,
    nothing -> the default; raises ValueError on unknown names."""
    wanted = [s.strip() for s in (text or ",".join(DEFAULT_SERVICES)).split(",") if s.strip()]
    if ALL in wanted:
        wanted = [s for s in wanted if s != ALL] + list(SELECTABLE)
    unknown = [s for s in wanted if s not in SELECTABLE]
    if unknown:
        raise ValueError(
            f"unknown service(s) {', '.join(unknown)}; choose from {', '.join(SELECTABLE)} "
            f"(or {ALL})"
        )
    chosen: set[str] = set()
    for name in wanted:
        chosen.add(name)
        chosen.update(REQUIRES[name])
    return tuple(s for s in SELECTABLE if s in chosen)


def stand_ins(services: tuple[str, ...]) -> tuple[str, ...]:
    """The stand-ins a cloud runs beside `services` (see STAND_IN_UNLESS)."""
    return tuple(s for s in STAND_INS if STAND_IN_UNLESS.get(s) not in services)


def service_types(services: tuple[str, ...]) -> list[str]:
    """The service types a cloud running `services` registers in its catalog, the stand-ins'
    included."""
    types = [SERVICE_TYPE[s] for s in services]
    return types + [STAND_INS[s][0] for s in stand_ins(services) if STAND_INS[s][0] not in types]


def needs_messaging(services: tuple[str, ...]) -> bool:
    return any(s in MESSAGING for s in services)


@dataclass(frozen=True)
class CloudSpec:
    index: int  # 1-based
    tls: bool = False  # every endpoint (backends and router frontends) in https

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def name(self) -> str:
        return "Cloud" + CLOUD_WORDS[self.index - 1]

    @property
    def slug(self) -> str:
        return self.name.lower()

    @property
    def region(self) -> str:
        return self.name

    @property
    def front_ip(self) -> str:
        return f"127.0.0.{1 + self.index}"

    @property
    def back_ip(self) -> str:
        return f"127.0.1.{1 + self.index}"

    def port(self, service_type: str) -> int:
        return SERVICE_PORTS[service_type][0]

    def frontend_url(self, service_type: str) -> str:
        """Base URL of the router frontend for a service (no path)."""
        return f"{self.scheme}://{self.front_ip}:{self.port(service_type)}"

    def backend_url(self, service_type: str) -> str:
        return f"{self.scheme}://{self.back_ip}:{self.port(service_type)}"

    def endpoint_url(self, service_type: str, routed: bool) -> str:
        """The URL the keystone catalog advertises (router frontend, or backend when unrouted)."""
        base = self.frontend_url(service_type) if routed else self.backend_url(service_type)
        return base + SERVICE_PORTS[service_type][1]

    def backend_endpoint(self, service_type: str) -> str:
        return self.backend_url(service_type) + SERVICE_PORTS[service_type][1]

    @property
    def peer_url(self) -> str:
        return f"https://{self.front_ip}:{PEER_PORT}"

    @property
    def proxy_listen(self) -> str:
        return f"{self.front_ip}:{PROXY_PORT}"

    @property
    def metrics_listen(self) -> str:
        return f"{self.front_ip}:{METRICS_PORT}"

    def db_name(self, suffix: str) -> str:
        return f"{self.slug}_{suffix}"


@dataclass
class LabPaths:
    root: Path
    venv: Path = field(init=False)
    etc: Path = field(init=False)
    data: Path = field(init=False)
    logs: Path = field(init=False)
    run: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.root.expanduser().resolve()
        self.venv = self.root / "venv"
        self.etc = self.root / "etc"
        self.data = self.root / "data"
        self.logs = self.root / "logs"
        self.run = self.root / "run"

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def clouds_yaml(self) -> Path:
        return self.root / "clouds.yaml"

    @property
    def federation_yaml(self) -> Path:
        return self.root / "federation.yaml"

    @property
    def pki(self) -> Path:
        """The lab's CA and the routers' peer-link certificates (keys mode 0600)."""
        return self.root / "pki"

    @property
    def ca_cert(self) -> Path:
        """The lab's CA: it signs the peer links' and, in a TLS lab, every endpoint's
        certificate (what clients and routers verify with)."""
        return self.pki / "ca.crt"

    def tls_files(self, cloud: CloudSpec, what: str) -> tuple[Path, Path]:
        """A TLS lab's certificate and key of `cloud`: ``backend`` (its services, on its
        backend address), ``frontend`` (its router's https frontends) or ``proxy-ca`` (the CA
        its router's forward proxy intercepts TLS with)."""
        return self.pki / f"{cloud.slug}-{what}.crt", self.pki / f"{cloud.slug}-{what}.key"

    def trust_bundle(self, cloud: CloudSpec) -> Path:
        """What the services of `cloud` trust in a TLS lab (their REQUESTS_CA_BUNDLE and
        SSL_CERT_FILE): the lab's CA and the cloud's interception CA."""
        return self.pki / f"{cloud.slug}-trust.pem"

    def venv_bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def cloud_etc(self, cloud: CloudSpec, service: str) -> Path:
        return self.etc / cloud.slug / service

    def cloud_data(self, cloud: CloudSpec, what: str) -> Path:
        return self.data / cloud.slug / what

    def log(self, cloud: CloudSpec | None, name: str) -> Path:
        if cloud is None:
            return self.logs / f"{name}.log"
        return self.logs / cloud.name / f"{name}.log"

    def dropins(self, process: str) -> Path:
        """The systemd-style drop-in directory of a lab process (see CloudRunner.env)."""
        return self.root / "systemd" / f"{process}.service.d"

    def marker(self, cloud: CloudSpec | None, name: str) -> Path:
        """A file that records a finished one-time step (db sync, bootstrap ...)."""
        where = self.data / (cloud.slug if cloud else "shared") / "done"
        return where / name
