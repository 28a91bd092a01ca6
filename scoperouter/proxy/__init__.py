"""The router's processes: the only place that wires the router's logic
(:mod:`scoperouter.router`) to its HTTP layer (:mod:`scoperouter.http`) and to mitmproxy.

``serve(options)`` runs the router of one cloud (see :mod:`~.supervisor`) until SIGTERM or
SIGINT and returns the exit code. Modules:

* :mod:`~.supervisor` - listening sockets (SO_REUSEPORT, one per worker), worker processes,
  reload, draining, ``/metrics`` and ``/healthz``;
* :mod:`~.worker` - one worker process: the router's parts, one sweep for every deadline,
  signals, draining;
* :mod:`~.reverse` - the frontends and the peer link: the HTTP server, each request handed to
  the pipeline, sent with the one exchange client;
* :mod:`~.forward` - the forward proxy (``HTTP_PROXY``) on mitmproxy, imported only by a worker
  whose cloud has one.
"""

from __future__ import annotations

from scoperouter.proxy.supervisor import Options, serve

__all__ = ["Options", "serve"]
