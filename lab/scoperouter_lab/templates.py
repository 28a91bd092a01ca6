"""Configuration files of the OpenStack services of one lab cloud.

Each function returns the text of one file. The values that matter are commented where they are
set. Paths come from the lab's directory (``LabPaths``), never from this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scoperouter_lab.layout import (
    POSTGRES_PORT,
    RABBIT_PORT,
    SHARED_HOST,
    CloudSpec,
    LabPaths,
)


@dataclass(frozen=True)
class Secrets:
    """The secrets one cloud's configuration uses. admin, demo, service and router are that
    cloud's own (no cloud's files hold another cloud's admin or service password); db and
    rabbit belong to the lab's shared PostgreSQL and RabbitMQ."""

    admin: str
    demo: str
    service: str
    db: str
    rabbit: str
    router: str  # the cloud's `scoperouter` user (service role), used by the other routers
    alt_demo: str  # a second ordinary user (project alt_demo), like devstack's


@dataclass(frozen=True)
class CloudContext:
    """What the templates of one cloud need."""

    cloud: CloudSpec
    paths: LabPaths
    secrets: Secrets
    routed: bool  # catalog endpoints point at the router (else straight at the backends)

    @property
    def keystone_url(self) -> str:
        """Where the services find keystone: the catalog's identity URL."""
        return self.cloud.endpoint_url("identity", self.routed)

    def db_url(self, suffix: str) -> str:
        """A database of the lab's shared PostgreSQL (holds the database password)."""
        return (
            f"postgresql+psycopg2://openstack:{self.secrets.db}@{SHARED_HOST}:{POSTGRES_PORT}/"
            f"{self.cloud.db_name(suffix)}"
        )

    @property
    def transport_url(self) -> str:
        return f"rabbit://openstack:{self.secrets.rabbit}@{SHARED_HOST}:{RABBIT_PORT}/{self.cloud.slug}"

    @property
    def placement_db(self) -> Path:
        """Placement's SQLite file (see placement_conf for why not PostgreSQL)."""
        return self.data("placement") / "placement.sqlite"

    def etc(self, service: str) -> Path:
        return self.paths.cloud_etc(self.cloud, service)

    def data(self, what: str) -> Path:
        return self.paths.cloud_data(self.cloud, what)


def _auth(ctx: CloudContext, section: str, username: str, extra: str = "") -> str:
    return f"""
[{section}]
auth_type = password
auth_url = {ctx.keystone_url}
project_domain_name = Default
user_domain_name = Default
project_name = service
username = {username}
password = {ctx.secrets.service}
region_name = {ctx.cloud.region}
{extra}"""


def _authtoken(ctx: CloudContext, username: str, service_type: str) -> str:
    # interface = public: the lab registers public endpoints only.
    # service_token_roles_required: accept service tokens only from users with the service role.
    # service_type: keystonemiddleware then enforces application credentials' access rules
    # (without it keystone refuses to validate any token restricted by access rules).
    return _auth(
        ctx,
        "keystone_authtoken",
        username,
        f"""www_authenticate_uri = {ctx.keystone_url}
interface = public
service_token_roles_required = true
service_type = {service_type}
""",
    )


def keystone_conf(ctx: CloudContext) -> str:
    return f"""[DEFAULT]
debug = false

[database]
connection = {ctx.db_url("keystone")}

[token]
provider = fernet
expiration = 14400

[fernet_tokens]
key_repository = {ctx.data("keystone-fernet")}

[fernet_receipts]
key_repository = {ctx.data("keystone-fernet")}

[credential]
key_repository = {ctx.data("keystone-credential")}

[cache]
# one uWSGI process (threads), so an in-process cache stays consistent; without it every
# request recomputes role assignments (~200 SQL queries, 0.3-1 s of CPU)
enabled = true
backend = dogpile.cache.memory
expiration_time = 60

[identity]
# bcrypt's minimum cost: a test lab, where creating users should be quick
password_hash_rounds = 4
"""


def glance_conf(ctx: CloudContext) -> str:
    return f"""[DEFAULT]
debug = false
enabled_backends = fs:file
workers = 1

[database]
connection = {ctx.db_url("glance")}

[paste_deploy]
flavor = keystone
config_file = {ctx.etc("glance") / "glance-api-paste.ini"}

[glance_store]
default_backend = fs

[fs]
filesystem_store_datadir = {ctx.data("glance-images")}

[os_glance_staging_store]
filesystem_store_datadir = {ctx.data("glance-staging")}

[os_glance_tasks_store]
filesystem_store_datadir = {ctx.data("glance-tasks")}

[oslo_concurrency]
lock_path = {ctx.data("locks")}
{_authtoken(ctx, "glance", "image")}"""


def placement_conf(ctx: CloudContext) -> str:
    # SQLite, not the shared PostgreSQL: placement's usage queries (GET /usages from
    # microversion 1.38, which openstacksdk and osc-placement ask for) select columns that are
    # neither grouped nor aggregated (placement/objects/usage.py, _get_by_consumer_type). MySQL
    # and SQLite accept that; PostgreSQL refuses it ("GroupingError: column ... must appear in
    # the GROUP BY clause") and no setting changes that. SQLite is the backend placement's own
    # tests run on; placement runs as one single-threaded process here, so SQLite's single
    # writer is no limit (WAL mode is set once by `lab up`).
    return f"""[DEFAULT]
debug = false

[placement_database]
connection = sqlite:///{ctx.placement_db}

[api]
auth_strategy = keystone
{_authtoken(ctx, "placement", "placement")}"""


def nova_conf(ctx: CloudContext) -> str:
    """nova.conf without database sections (nova-compute must not see them)."""
    c = ctx.cloud
    return f"""[DEFAULT]
debug = false
host = {c.slug}-compute
my_ip = {c.back_ip}
state_path = {ctx.data("nova")}
instances_path = {ctx.data("nova") / "instances"}
transport_url = {ctx.transport_url}
# a stable node name and uuid across restarts (plain fake.FakeDriver refuses to restart)
compute_driver = fake.FakeDriverWithoutFakeNodes
graceful_shutdown_timeout = 5
allow_resize_to_same_host = true

[api]
auth_strategy = keystone

[wsgi]
api_paste_config = {ctx.etc("nova") / "api-paste.ini"}

[conductor]
workers = 1

[scheduler]
workers = 1
discover_hosts_in_cells_interval = -1

[oslo_concurrency]
lock_path = {ctx.data("locks")}

[oslo_messaging_notifications]
driver = noop

[vnc]
# the fake driver answers console requests with a fixed address: remote consoles can be created
# (nova-api stores their token), no noVNC proxy runs behind the URL
enabled = true
server_listen = {c.back_ip}
server_proxyclient_address = {c.back_ip}
novncproxy_base_url = http://{c.back_ip}:6080/vnc_auto.html

[glance]
# nova-api fetches images from the image endpoint of the user's token catalog in this region
region_name = {c.region}
valid_interfaces = public
""" + "".join(
        [
            _authtoken(ctx, "nova", "compute"),
            _auth(ctx, "service_user", "nova", "send_service_user_token = true\n"),
            _auth(ctx, "placement", "nova", "valid_interfaces = public\n"),
            _auth(ctx, "neutron", "nova", "valid_interfaces = public\n"),
        ]
    )


def nova_db_conf(ctx: CloudContext) -> str:
    """Database sections, given to nova-api, conductor, scheduler and nova-manage only."""
    return f"""[api_database]
connection = {ctx.db_url("nova_api")}

[database]
connection = {ctx.db_url("nova_cell1")}
"""


def nova_cell0_map_conf(ctx: CloudContext) -> str:
    """Only for ``nova-manage cell_v2 map_cell0``: nova maps cell0 to this URL + ``_cell0``,
    i.e. the ``<cloud>_nova_cell0`` database."""
    return f"""[database]
connection = {ctx.db_url("nova")}
"""


def uwsgi_ini(
    ctx: CloudContext,
    name: str,
    module: str,
    port: int,
    env: dict[str, str],
    processes: int = 1,
    threads: int = 1,
) -> str:
    envs = "".join(f"env = {k}={v}\n" for k, v in env.items())
    return f"""[uwsgi]
http-socket = {ctx.cloud.back_ip}:{port}
module = {module}
virtualenv = {ctx.paths.venv}
master = true
processes = {processes}
threads = {threads}
enable-threads = true
lazy-apps = true
need-app = true
die-on-term = true
hook-master-start = unix_signal:15 gracefully_kill_them_all
worker-reload-mercy = 5
thunder-lock = true
buffer-size = 65535
# request bodies as glance and keystone expect them (raw, chunked uploads)
http-raw-body = true
http-chunked-input = true
http-auto-chunked = true
# uWSGI's http-socket closes kept-alive connections silently: tell clients
add-header = Connection: close
procname-prefix-spaced = {ctx.cloud.slug}-{name}
{envs}"""
