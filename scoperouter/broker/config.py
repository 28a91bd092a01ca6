"""The broker's configuration (``scoperouter broker serve --config FILE``).

A YAML file holds everything but secrets: where to listen, the database URL, the clouds (each a
clouds.yaml entry whose URLs are that cloud's router), the services with their plans, the
identity mapping table, deadlines and worker settings. Secrets come only from the environment or
from files the config names, never from the config itself: the platform's basic-auth password
(``SCOPEROUTER_BROKER_PASSWORD`` or ``auth.password_file``), the keys that encrypt secrets at
rest (``SCOPEROUTER_BROKER_SECRET_KEYS`` or ``secrets.keys_file``), cloud passwords (clouds.yaml /
secure.yaml). A key that looks like a secret in the YAML (``password``) is refused, so a
password cannot be committed with a config by mistake.

`config/broker.yaml` is a working, commented sample (a test loads it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PASSWORD_ENV = "SCOPEROUTER_BROKER_PASSWORD"
SECRET_KEYS_ENV = "SCOPEROUTER_BROKER_SECRET_KEYS"
DATABASE_ENV = "SCOPEROUTER_BROKER_DATABASE_URL"
DEFAULT_LISTEN = "127.0.0.1:8090"
DEFAULT_METRICS_LISTEN = "127.0.0.1:8091"
# OSB bodies are small (parameters, a context): 1 MiB is 16 times the largest parameter schema
# the spec allows; Kubernetes caps a whole object (its parameters included) at 1.5 MiB
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

OperationName = Literal["provision", "update", "deprovision", "bind", "unbind"]


class BrokerConfigError(ValueError):
    """A config that cannot be used; the message names the file and the key path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuthConfig(_Strict):
    """HTTP basic auth of the platform. No default password: serve refuses to start without
    one (from ``$SCOPEROUTER_BROKER_PASSWORD`` or `password_file`)."""

    username: str = Field(default="broker", min_length=1)
    password_file: Path | None = None


class DatabaseConfig(_Strict):
    """A SQLAlchemy URL. SQLite (a file) for one broker process; PostgreSQL
    (``postgresql+psycopg://user@host/db``) for several replicas.
    ``$SCOPEROUTER_BROKER_DATABASE_URL`` overrides it (a password in the URL then need not be
    in the file)."""

    url: str = "sqlite:///broker.db"
    # serve upgrades an out-of-date schema before serving (on PostgreSQL under an advisory
    # lock, so replicas starting together upgrade once); false: refuse to start instead
    auto_upgrade: bool = True


class SecretsConfig(_Strict):
    """Keys of MultiFernet (newest first), one per line in `keys_file`, or comma separated
    in ``$SCOPEROUTER_BROKER_SECRET_KEYS``."""

    keys_file: Path | None = None


class CloudConfig(_Strict):
    """One federation cloud: the clouds.yaml entry the broker enters it with (its URLs are the
    cloud's router frontends) and, optionally, its keystone region."""

    entry: str = Field(min_length=1)
    region: str | None = None


class UserMapping(_Strict):
    """A row of the identity table: a platform user (the decoded
    ``X-Broker-API-Originating-Identity``) mapped to a keystone user that gets `role` on the
    projects the broker makes for that user's requests."""

    platform: str = Field(min_length=1)  # "cloudfoundry", "kubernetes", ...
    match: dict[str, str] = Field(min_length=1)  # every key must equal the identity's value
    keystone_user: str = Field(min_length=1)  # name (in `domain`) or id, in each cloud
    role: str = "member"
    clouds: tuple[str, ...] | None = None  # None: every cloud


class IdentityConfig(_Strict):
    """How platform identities map to keystone (README "Identity mapping")."""

    domain: str = "Default"  # where managed projects and mapped users live
    # the roles a binding's application credential carries (least privilege)
    binding_roles: tuple[str, ...] = ("member",)
    users: tuple[UserMapping, ...] = ()
    # the tenant of a platform other than cloudfoundry and kubernetes: the context keys that
    # name it (e.g. {"sapcp": ["subaccount_id"]}); a request from an unmapped platform is 400
    platforms: dict[str, tuple[str, ...]] = Field(default_factory=dict)

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for name, keys in value.items():
            if not name or name in ("cloudfoundry", "kubernetes"):
                raise ValueError(f"{name!r}: cloudfoundry and kubernetes are built in")
            if not keys or not all(keys):
                raise ValueError(f"{name}: expected a list of context keys naming the tenant")
        return value


class WorkerConfig(_Strict):
    threads: int = Field(default=2, ge=0, le=64)  # 0: API only (another replica works)
    lease_seconds: float = Field(default=30.0, gt=1)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    poll_seconds: float = Field(default=1.0, gt=0)  # idle wait between claims
    max_retry_seconds: float = Field(default=60.0, gt=0)  # backoff cap after an error


class MetricsConfig(_Strict):
    """The Prometheus listener (``/metrics``), off by default; on, it listens on loopback
    unless `listen` says otherwise (as the API's `listen`), one per ``serve`` (its processes
    and worker threads added up)."""

    enabled: bool = False
    listen: str = DEFAULT_METRICS_LISTEN

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _hostport(value)

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


def _hostport(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


DEFAULT_DEADLINES: dict[str, float] = {
    "provision": 1800.0,
    "update": 1800.0,
    "deprovision": 1800.0,
    "bind": 300.0,
    "unbind": 300.0,
}


class ServiceConfig(BaseModel):
    """A service enabled by name. The broker reads the keys below; every other key (plans
    included) is the service's own and reaches it as ``Service.settings``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: bool = True
    # "package.module:Class": a service class by import path, for a plug-in that is not
    # installed as an entry point (default: the entry point of the service's name)
    plugin: str | None = Field(default=None, pattern=r"^[\w.]+:\w+$")
    # services defined without Python: "ansible" (a pack directory: `pack`), "heat" (HOT
    # templates as plans: `plans[].template`); the service's name is its key here
    type: Literal["ansible", "heat"] | None = None
    deadlines: dict[OperationName, float] = Field(default_factory=dict)
    # seconds a bind/unbind without accepts_incomplete=true may run inline before the API
    # answers; 0: such requests get 422 AsyncRequired
    synchronous_seconds: float = Field(default=30.0, ge=0, le=600)

    def service_settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def deadline(self, kind: str) -> float:
        return float(self.deadlines.get(kind, DEFAULT_DEADLINES[kind]))  # type: ignore[call-overload]


class BrokerConfig(_Strict):
    version: Literal[1] = 1
    listen: str = DEFAULT_LISTEN
    # serve processes sharing the listening socket (one core each; each with its workers)
    processes: int = Field(default=1, ge=1, le=64)
    # where the platform reaches the broker; only shown in logs and `broker show`
    advertised_url: str | None = None
    auth: AuthConfig = AuthConfig()
    database: DatabaseConfig = DatabaseConfig()
    secrets: SecretsConfig = SecretsConfig()
    clouds_yaml: tuple[Path, ...] = ()  # default: openstacksdk's search path
    secure_yaml: tuple[Path, ...] = ()
    clouds: dict[str, CloudConfig] = Field(default_factory=dict)
    identity: IdentityConfig = IdentityConfig()
    worker: WorkerConfig = WorkerConfig()
    metrics: MetricsConfig = MetricsConfig()
    services: dict[str, ServiceConfig] = Field(default_factory=dict)
    # API versions accepted in X-Broker-API-Version (MAJOR.MINOR, minimum)
    min_api_version: str = "2.13"
    # the largest request body the API reads (bytes); a larger one is 413 before more is read
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=4096, le=64 * 1024 * 1024)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # where the file was; relative paths in it are relative to its folder
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _hostport(value)

    @field_validator("min_api_version")
    @classmethod
    def _version(cls, value: str) -> str:
        parse_api_version(value)
        return value

    # ----------------------------------------------------------------------- derived values

    @property
    def listen_address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    def database_url(self, environ: Mapping[str, str] | None = None) -> str:
        environ = os.environ if environ is None else environ
        url = environ.get(DATABASE_ENV) or self.database.url
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            rest = url[len("sqlite:///") :]
            if rest and rest != ":memory:" and not rest.startswith("file:"):
                path = Path(rest).expanduser()
                if not path.is_absolute() and self.source is not None:
                    path = self.source.parent / path
                url = "sqlite:///" + str(path)
        return url

    def path(self, value: Path) -> Path:
        value = value.expanduser()
        if not value.is_absolute() and self.source is not None:
            return self.source.parent / value
        return value

    def password(self, environ: Mapping[str, str] | None = None) -> str:
        """The basic-auth password; raises BrokerConfigError when none is configured."""
        environ = os.environ if environ is None else environ
        if environ.get(PASSWORD_ENV):
            return environ[PASSWORD_ENV]
        if self.auth.password_file is not None:
            path = self.path(self.auth.password_file)
            try:
                text = path.read_text().strip()
            except OSError as exc:
                raise BrokerConfigError(f"auth.password_file: cannot read {path}: {exc}") from None
            if text:
                return text
            raise BrokerConfigError(f"auth.password_file: {path} is empty")
        raise BrokerConfigError(
            f"no broker password: set ${PASSWORD_ENV} or auth.password_file (there is no default)"
        )

    def secret_keys(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The MultiFernet keys, newest first; raises BrokerConfigError when none."""
        environ = os.environ if environ is None else environ
        text = environ.get(SECRET_KEYS_ENV, "")
        keys = [k.strip() for k in text.split(",") if k.strip()]
        if not keys and self.secrets.keys_file is not None:
            path = self.path(self.secrets.keys_file)
            try:
                lines = path.read_text().splitlines()
            except OSError as exc:
                raise BrokerConfigError(f"secrets.keys_file: cannot read {path}: {exc}") from None
            keys = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not keys:
            raise BrokerConfigError(
                f"no secret keys: set ${SECRET_KEYS_ENV} or secrets.keys_file "
                "(make one with `scoperouter broker rotate-key --generate`)"
            )
        return keys

    def enabled_services(self) -> dict[str, ServiceConfig]:
        return {name: svc for name, svc in self.services.items() if svc.enabled}


def parse_api_version(text: str) -> tuple[int, int]:
    major, sep, minor = text.strip().partition(".")
    if not sep or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"expected MAJOR.MINOR, got {text!r}")
    return int(major), int(minor)


_SECRET_KEYS = {"password", "secret", "application_credential_secret", "keys"}


def _refuse_secrets(data: object, path: str = "") -> None:
    if isinstance(data, Mapping):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key).lower() in _SECRET_KEYS and value not in (None, ""):
                raise BrokerConfigError(
                    f"{where}: secrets are not read from the broker config; use the "
                    "environment or a file (see the sample config/broker.yaml)"
                )
            _refuse_secrets(value, where)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _refuse_secrets(value, f"{path}[{index}]")


def load_config(path: str | Path) -> BrokerConfig:
    """Load and validate a broker config; BrokerConfigError names the file and key path."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise BrokerConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise BrokerConfigError(f"{path}: not valid YAML: {exc}") from None
    return config_from_dict(data, source=path)


def config_from_dict(data: object, *, source: Path | None = None) -> BrokerConfig:
    where = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise BrokerConfigError(f"{where}expected a mapping at the top level")
    try:
        _refuse_secrets(data)
    except BrokerConfigError as exc:
        raise BrokerConfigError(f"{where}{exc}") from None
    try:
        config = BrokerConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise BrokerConfigError(f"{where}{loc}: {first['msg']}") from None
    for name, svc in config.services.items():
        for key in svc.deadlines:
            if svc.deadlines[key] <= 0:
                raise BrokerConfigError(f"{where}services.{name}.deadlines.{key}: must be > 0")
    if config.metrics.enabled and config.metrics.address == config.listen_address:
        raise BrokerConfigError(f"{where}metrics.listen: the same address as listen")
    if config.worker.heartbeat_seconds >= config.worker.lease_seconds:
        raise BrokerConfigError(
            f"{where}worker.heartbeat_seconds: must be shorter than worker.lease_seconds"
        )
    for row_index, row in enumerate(config.identity.users):
        for cloud in row.clouds or ():
            if cloud not in config.clouds:
                raise BrokerConfigError(
                    f"{where}identity.users[{row_index}].clouds: unknown cloud {cloud!r}"
                )
    return config
