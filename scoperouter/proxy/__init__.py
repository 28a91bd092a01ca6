"""The mitmproxy adapter: the router of one cloud, as a supervisor and its worker processes.

``serve(options)`` runs the router (see :mod:`scoperouter.proxy.supervisor`) until SIGTERM or
SIGINT and returns the exit code. Modules:

* ``supervisor`` - listening sockets (SO_REUSEPORT, one per worker), worker processes, reload,
  draining, ``/metrics`` and ``/healthz`` (no mitmproxy import);
* ``worker``, ``engine`` - one worker: the embedded mitmproxy master and its lifecycle;
* ``addons/`` - the router's addons, one concern each (routing, limits, timeouts, peer health,
  identity, errors, access log, metrics) and the chain that calls them;
* ``mitm`` - every use of mitmproxy internals (checked by tests/unit/test_mitm_contract.py);
* ``flowstate``, ``listeners``, ``logs``, ``metrics`` - shared pieces.
"""

from __future__ import annotations

from scoperouter.proxy.supervisor import Options, serve

__all__ = ["Options", "serve"]
