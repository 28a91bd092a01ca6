"""HAProxy + a Lua scope script: the design this project improves on, for ``bench.peers``.

OpenStackoid (BeyondTheClouds/openstackoid, ``playbooks/haproxy/lua/interpret_scope.lua`` and
``playbooks/haproxy/haproxy.cfg.j2``) routed scopes with HAProxy: a Lua sample fetch,
``use_backend %[lua.interpret_scope("RegionOne")]``, read the scope from ``X-Scope`` or from
``X-Auth-Token`` (split on ``!SCOPE!``), decoded it with a Lua JSON library (``json.decode``),
picked the backend named ``<region>_<service type>_<interface>`` (this region's service, or
another region's HAProxy) and removed the scope from the token before forwarding.

:data:`LUA_SCRIPT` does the same for one frontend, in the few lines a request costs: HAProxy 2.6
has no JSON decoder in its Lua core, and the scope is a small flat object of strings
(``{"image": "CloudTwo", ...}``), so the cloud of the frontend's service is taken with a Lua
pattern. It runs as an ``http-request`` action (HAProxy 2.x edits headers in actions, not in
sample fetches) that stores the backend's name in a variable for ``use_backend``, and is loaded
once per thread (``lua-load-per-thread``: with ``lua-load`` every thread would share one Lua
state behind a lock). Debian's ``haproxy`` is used as installed (``apt-get install haproxy``
when missing and allowed); it runs in the foreground (``-db``) with a config of the bench's,
on loopback only.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.machine import apt_install
from bench.procs import Proc, Processes, wait_listening

HOST = "127.0.0.5"  # HAProxy listens here (routers .2/.3, bench.floor's proxies .4)
NO_SUCH_CLOUD = "no_such_cloud"  # the default backend: no server, so a 503

# The scope script (see the module's docstring for OpenStackoid's original).
LUA_SCRIPT = r"""
-- written by `python -m bench.peers`: scope routing in the style of OpenStackoid's
-- interpret_scope.lua (github.com/BeyondTheClouds/openstackoid,
-- playbooks/haproxy/lua/interpret_scope.lua), one frontend's service.
local SEPARATOR = "!SCOPE!"
local patterns = {}  -- service type -> the Lua pattern of its entry in the scope

-- The cloud the scope names for `service`: the scope is a flat JSON object of strings and
-- HAProxy's Lua has no JSON decoder, so the entry is matched by hand ("image": "CloudTwo").
local function cloud_in(scope, service)
  local pattern = patterns[service]
  if pattern == nil then
    pattern = '"' .. (service:gsub("%p", "%%%0")) .. '"%s*:%s*"([^"]*)"'
    patterns[service] = pattern
  end
  return scope:match(pattern)
end

-- http-request lua.interpret_scope <this cloud> <service type>: the backend to use in
-- txn.scope_backend (<cloud>_<service type>), the token forwarded without its scope.
core.register_action("interpret_scope", { "http-req" }, function(txn, here, service)
  local cloud = here
  local token = txn.f:req_fhdr("x-auth-token")  -- the whole value: a scope has commas
  if token then
    local i, j = token:find(SEPARATOR, 1, true)
    if i then
      local scope = token:sub(j + 1)
      cloud = cloud_in(scope, service) or here
      txn.http:req_set_header("X-Auth-Token", token:sub(1, i - 1))
      txn.http:req_set_header("X-Scope", scope)
    end
  end
  txn:set_var("txn.scope_backend", cloud .. "_" .. service)
end, 2)
"""


@dataclass(frozen=True)
class HAProxy:
    binary: str
    version: str  # the first line of `haproxy -v`


def find_haproxy() -> str | None:
    """The haproxy binary on the PATH or in /usr/sbin (root's PATH has it, others' may not)."""
    found = shutil.which("haproxy")
    if found:
        return found
    return "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None


def ensure_haproxy(allow_apt: bool, say: Callable[[str], None]) -> HAProxy | None:
    """Debian's haproxy: found, else installed with apt-get (root, `allow_apt`), else None."""
    binary = find_haproxy()
    if binary is None and allow_apt and apt_install("haproxy", say):
        binary = find_haproxy()
    if binary is None:
        return None
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30).stdout
    return HAProxy(binary, out.splitlines()[0] if out else binary)


def maxconn_for(connections: int) -> int:
    """HAProxy's maxconn for a load of `connections` client connections (each may hold a
    server connection too): room for twice as many, at least 4,096."""
    return max(4096, 2 * connections)


def config(
    listen: tuple[str, int],
    lua: Path,
    here: str,
    service: str,
    backends: Mapping[str, tuple[str, int]],
    threads: int = 1,
    maxconn: int = 4096,
) -> str:
    """An haproxy.cfg: one frontend for `service` on `listen`, routed by the scope script;
    `backends` maps each cloud to the address its requests for `service` go to (this cloud:
    its backend; another: its router). Keep-alive on both sides, idle server connections
    shared between client connections (``http-reuse always``)."""
    host, port = listen
    lines = [
        "# generated by `python -m bench.peers`",
        "global",
        f"    nbthread {threads}",
        f"    maxconn {maxconn}",
        f"    lua-load-per-thread {lua}",
        "defaults",
        "    mode http",
        "    option http-keep-alive",
        "    http-reuse always",
        f"    maxconn {maxconn}",
        "    timeout connect 5s",
        "    timeout client 60s",
        "    timeout server 60s",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 60s",
        f"frontend {service}",
        f"    bind {host}:{port}",
        f"    http-request lua.interpret_scope {here} {service}",
        "    use_backend %[var(txn.scope_backend)]",
        f"    default_backend {NO_SUCH_CLOUD}",
    ]
    for cloud, (backend_host, backend_port) in backends.items():
        lines += [f"backend {cloud}_{service}", f"    server {cloud} {backend_host}:{backend_port}"]
    lines += [f"backend {NO_SUCH_CLOUD}", "    # no server: an unknown cloud gets a 503"]
    return "\n".join(lines) + "\n"


def start(
    procs: Processes,
    haproxy: HAProxy,
    listen: tuple[str, int],
    here: str,
    service: str,
    backends: Mapping[str, tuple[str, int]],
    threads: int = 1,
    maxconn: int = 4096,
    name: str = "haproxy",
) -> Proc:
    """HAProxy in the foreground with the scope script, listening on `listen` when it returns."""
    lua = procs.workdir / "scope.lua"
    lua.write_text(LUA_SCRIPT)
    cfg = procs.workdir / f"{name}.cfg"
    cfg.write_text(config(listen, lua, here, service, backends, threads, maxconn))
    proc = procs.start(name, [haproxy.binary, "-db", "-f", str(cfg)])
    wait_listening(*listen, proc, timeout=30)
    return proc
