"""The router's Prometheus metrics (prometheus-client).

Each worker process updates them; with several workers the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before they start, so values go to files there and the supervisor's
``/metrics`` endpoint adds them up (gauges as documented per metric). Label values are bounded:
service types and cloud names come from the config, statuses from HTTP.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "scoperouter_requests",
    "Requests answered, by service type, target cloud, decision (local, remote, refused) and "
    "HTTP status ('-': no service or cloud).",
    ["service", "cloud", "decision", "status"],
)
DURATION = Histogram(
    "scoperouter_request_duration_seconds",
    "Time from the request head to the answer, by service type and decision.",
    ["service", "decision"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
OPEN_CONNECTIONS = Gauge(
    "scoperouter_open_connections",
    "Client connections open now (all workers).",
    multiprocess_mode="livesum",
)
UPSTREAM_UP = Gauge(
    "scoperouter_upstream_up",
    "1 when an upstream (another cloud's router: kind=peer; a service of this cloud: "
    "kind=backend) takes requests, 0 while it is marked down (any worker).",
    ["cloud", "kind", "service", "upstream"],
    multiprocess_mode="livemin",
)
RELOADS = Counter(
    "scoperouter_config_reloads",
    "Config reloads by result (ok, refused).",
    ["result"],
)
