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
    SWIFT_STORAGE_PORTS,
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
    swift_hash: str = ""  # swift's hash path suffix (which partition holds a name)


@dataclass(frozen=True)
class CloudContext:
    """What the templates of one cloud need."""

    cloud: CloudSpec
    paths: LabPaths
    secrets: Secrets
    routed: bool  # catalog endpoints point at the router (else straight at the backends)

    @property
    def tls(self) -> bool:
        """Every endpoint of the cloud in https (``lab up --tls``)."""
        return self.cloud.tls

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
            # cinder (or the lab's block-storage stand-in) as the catalog lists it; nova calls
            # it with the user's token (scope included: block storage follows compute)
            _auth(
                ctx,
                "cinder",
                "nova",
                f"os_region_name = {c.region}\ncatalog_info = block-storage::publicURL\n",
            ),
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
    argv: tuple[str, ...] = (),
) -> str:
    """`argv`: the application's command-line arguments (sys.argv[1:], uWSGI's pyargv), for
    the services that read their config files from there (cinder, heat)."""
    envs = "".join(f"env = {k}={v}\n" for k, v in env.items())
    if argv:
        envs += f"pyargv = {' '.join(argv)}\n"
    socket = f"http-socket = {ctx.cloud.back_ip}:{port}"
    if ctx.tls:
        # a TLS lab: uWSGI serves https itself (its OpenSSL plugin; the same HTTP parser as
        # http-socket, so the options below hold), with the cloud's backend certificate
        cert, key = ctx.paths.tls_files(ctx.cloud, "backend")
        socket = f"https-socket = {ctx.cloud.back_ip}:{port},{cert},{key}"
    return f"""[uwsgi]
{socket}
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


def cinder_conf(ctx: CloudContext) -> str:
    """cinder-api, -scheduler and -volume: one backend, cinder's own fake driver (it logs what
    it would do: volumes are rows, attachments answer an iSCSI-shaped connection that nova's
    fake virt driver records), as nova's fake virt driver fakes servers."""
    c = ctx.cloud
    return f"""[DEFAULT]
debug = false
host = {c.slug}-volume
my_ip = {c.back_ip}
state_path = {ctx.data("cinder")}
transport_url = {ctx.transport_url}
auth_strategy = keystone
api_paste_config = {ctx.etc("cinder") / "api-paste.ini"}
# which filters a list accepts (name, status ...): without it every filter is refused
resource_query_filters_file = {ctx.paths.venv / "etc" / "cinder" / "resource_filters.json"}
enabled_backends = fake
osapi_volume_workers = 1
graceful_shutdown_timeout = 5

[fake]
volume_driver = cinder.tests.fake_driver.FakeLoggingVolumeDriver
volume_backend_name = fake

[database]
connection = {ctx.db_url("cinder")}

[oslo_concurrency]
lock_path = {ctx.data("locks")}

[oslo_messaging_notifications]
driver = noop

[coordination]
backend_url = file://{ctx.data("cinder")}
""" + "".join(
        [
            _authtoken(ctx, "cinder", "block-storage"),
            _auth(ctx, "nova", "cinder", "interface = public\n"),
            _auth(ctx, "service_user", "cinder", "send_service_user_token = true\n"),
        ]
    )


def heat_conf(ctx: CloudContext) -> str:
    """heat-api and heat-engine. Stack users live in their own domain (`heat`, administered by
    `heat_domain_admin`, set up by `lab up` as devstack does); deferred operations use trusts
    to the `heat` service user. The engine calls nova, glance and the others with the user's
    token, scope included, through the router (HTTP_PROXY), like nova-api."""
    c = ctx.cloud
    venv_etc = ctx.paths.venv / "etc" / "heat"
    return f"""[DEFAULT]
debug = false
host = {c.slug}-heat
transport_url = {ctx.transport_url}
num_engine_workers = 1
region_name_for_services = {c.region}
deferred_auth_method = trusts
stack_user_domain_name = heat
stack_domain_admin = heat_domain_admin
stack_domain_admin_password = {ctx.secrets.service}
# where booted servers would call back (heat-api-cfn, :8000): the lab's servers are fake and
# never boot, so nothing runs there; heat needs the URLs to render a server's metadata
heat_metadata_server_url = http://{c.back_ip}:8000
heat_waitcondition_server_url = http://{c.back_ip}:8000/v1/waitcondition
environment_dir = {venv_etc / "environment.d"}
template_dir = {venv_etc / "templates"}
graceful_shutdown_timeout = 5

[database]
connection = {ctx.db_url("heat")}

[paste_deploy]
api_paste_config = {ctx.etc("heat") / "api-paste.ini"}

[heat_api]
workers = 1

[clients]
endpoint_type = publicURL

[clients_keystone]
auth_uri = {c.endpoint_url("identity", ctx.routed).removesuffix("/v3")}

[ec2authtoken]
auth_uri = {ctx.keystone_url}

[oslo_concurrency]
lock_path = {ctx.data("locks")}

[oslo_messaging_notifications]
driver = noop
""" + "".join(
        [
            _authtoken(ctx, "heat", "orchestration"),
            _auth(ctx, "trustee", "heat"),
        ]
    )


SWIFT_LOG_MODULE = "lab_swift_logging"  # SWIFT_LOG_HOOK's module, in the swift etc dir
SWIFT_LOG_HOOK = """# Written by `scoperouter lab up`: swift's loggers write to the console only
# (the lab's log file of the process), not to syslog, which swift adds whatever else it is told.
from logging.handlers import SysLogHandler


def console_only(conf, name, log_to_console, log_route, fmt, logger, adapted_logger):
    for handler in list(logger.handlers):
        if isinstance(handler, SysLogHandler):
            logger.removeHandler(handler)
            handler.close()
"""


def swift_conf(ctx: CloudContext) -> str:
    """swift.conf, which swift's servers read from their `swift_dir` (constraints and storage
    policies are read from /etc/swift only: their defaults hold, one policy, 4 KiB of
    metadata an object)."""
    return f"""[swift-hash]
swift_hash_path_suffix = {ctx.secrets.swift_hash}
swift_hash_path_prefix = {ctx.cloud.slug}

[storage-policy:0]
name = Policy-0
default = yes
"""


def _swift_default(ctx: CloudContext, kind: str, port: int) -> str:
    # workers = 0: one process serves (no fork); mount_check off: the devices are directories
    tls = ""
    if ctx.tls and kind == "proxy":
        # a TLS lab: the proxy (the catalog's endpoint) serves https itself (eventlet's wsgi);
        # its storage servers, which only it reaches, stay plain
        cert, key = ctx.paths.tls_files(ctx.cloud, "backend")
        tls = f"cert_file = {cert}\nkey_file = {key}\n"
    return f"""[DEFAULT]
{tls}bind_ip = {ctx.cloud.back_ip}
bind_port = {port}
workers = 0
swift_dir = {ctx.etc("swift")}
devices = {ctx.data("swift")}
mount_check = false
log_name = {ctx.cloud.slug}-swift-{kind}
log_level = INFO
log_custom_handlers = {SWIFT_LOG_MODULE}.console_only
"""


def swift_storage_conf(ctx: CloudContext, kind: str) -> str:
    """account-, container- or object-server.conf (`kind`: account, container, object)."""
    return (
        _swift_default(ctx, kind, SWIFT_STORAGE_PORTS[kind])
        + f"""
[pipeline:main]
pipeline = healthcheck {kind}-server

[app:{kind}-server]
use = egg:swift#{kind}

[filter:healthcheck]
use = egg:swift#healthcheck
"""
    )


_SWIFT_PLAIN_FILTERS = ("catch_errors", "gatekeeper", "healthcheck", "listing_formats", "bulk",
                        "tempurl", "copy", "container_quotas", "account_quotas", "slo", "dlo",
                        "symlink")  # fmt: skip


def swift_proxy_conf(ctx: CloudContext) -> str:
    """proxy-server.conf: keystone auth (authtoken + keystoneauth: a project's account is
    AUTH_<project id>, its admin and member roles operate it), accounts made on first use,
    large objects (SLO, DLO), no memcached (the proxy asks the storage servers each time).
    The access log shows no token (reveal_sensitive_prefix = 0)."""
    filters = "".join(f"\n[filter:{f}]\nuse = egg:swift#{f}\n" for f in _SWIFT_PLAIN_FILTERS)
    return (
        _swift_default(ctx, "proxy", 8080)
        + f"""
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy_logging listing_formats bulk tempurl
    authtoken keystoneauth copy container_quotas account_quotas slo dlo versioned_writes symlink
    proxy_logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
node_timeout = 60

[filter:proxy_logging]
use = egg:swift#proxy_logging
reveal_sensitive_prefix = 0

[filter:versioned_writes]
use = egg:swift#versioned_writes
allow_versioned_writes = true

[filter:keystoneauth]
use = egg:swift#keystoneauth
reseller_prefix = AUTH_
operator_roles = admin, member
reseller_admin_role = ResellerAdmin

[filter:authtoken]
paste.filter_factory = keystonemiddleware.auth_token:filter_factory
delay_auth_decision = true
www_authenticate_uri = {ctx.keystone_url}
auth_url = {ctx.keystone_url}
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = swift
password = {ctx.secrets.service}
region_name = {ctx.cloud.region}
interface = public
service_token_roles_required = true
service_type = object-store
{filters}"""
    )
