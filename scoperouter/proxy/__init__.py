"""The mitmproxy adapter: one router process per cloud.

``serve(config_path, cloud, watch=False)`` runs the router of `cloud` (reverse-proxy listeners
on the cloud's frontends, a forward proxy on ``proxy.listen``) until SIGINT/SIGTERM and returns
the exit code. SIGHUP (and, with ``watch``, a change of the file) reloads the config.

Modules: ``addon`` (the ScopeRouter addon: routing in ``requestheaders``), ``engine`` (the
embedded mitmproxy master and its lifecycle), ``listeners`` (mode specs), ``upstream`` (JSON
error responses, connect and response timeouts).
"""

from __future__ import annotations


def serve(config_path: str, cloud: str, watch: bool = False) -> int:
    """Run the router of `cloud` until SIGINT/SIGTERM; returns the process exit code."""
    from scoperouter.proxy.engine import serve as _serve  # mitmproxy is imported only here

    return _serve(config_path, cloud, watch)


__all__ = ["serve"]
