"""``scoperouter status``: every cloud's router at a glance, from their ``/status.json``."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from scoperouter.catalog import Catalog, Cloud
from scoperouter.cli.common import load
from scoperouter.cli.table import format_table

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
Ask every cloud's router of a federation config for its status (GET /status.json on the
cloud's metrics.listen address, all at once, each within --timeout seconds) and print one
table: router up, workers running/wanted, requests/s, error ratio (5xx) and p99 over the
routers' last minutes, peer links up/total, breakers open, the soonest certificate expiry, the
config generation and digest. Routers whose config digests (or versions) differ are flagged
as skew. A cloud without metrics.listen cannot be asked: it is listed as unmonitored.

Exit status: 0 when every router asked is up with no breaker open, no upstream down and no
certificate expiring within --expiry-days; 1 otherwise (the problems are listed); 2 for bad
usage or an unusable config.
"""

EPILOG = """\
examples:
  scoperouter status --config /etc/scoperouter/federation.yaml
  scoperouter status --config federation.yaml --json --timeout 2   # for scripts and cron
  scoperouter status --config federation.yaml --cloud CloudOne --expiry-days 30
"""

BODY_MAX = 16 * 1024 * 1024  # bytes of one router's answer
TEXT_MAX = 64  # characters of a name from a router's answer, as printed


def register(sub: Subparsers) -> argparse.ArgumentParser:
    status = sub.add_parser(
        "status",
        help="the status of every cloud's router (exit 1 when something is wrong)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--config", required=True, metavar="FILE", help="the federation config")
    status.add_argument(
        "--cloud", action="append", metavar="NAME", help="ask only this cloud's router (repeat)"
    )
    status.add_argument(
        "--timeout", type=_seconds, default=5.0, metavar="S", help="per router (default 5)"
    )
    status.add_argument(
        "--expiry-days",
        type=_seconds,
        default=14.0,
        metavar="D",
        help="a certificate expiring within D days is a problem (default 14)",
    )
    status.add_argument("--json", action="store_true", help="print JSON, not a table")
    status.set_defaults(func=run)
    return status


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:20]!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"out of range: {text[:20]!r}")
    return value


@dataclass
class Row:
    """One cloud's line."""

    cloud: str
    router: str  # up, down, unmonitored
    address: str | None = None  # host:port of its metrics listener
    error: str | None = None  # why it is down
    status: str | None = None  # the router's own (ok, degraded, starting, stopping)
    version: str | None = None
    workers_running: int | None = None
    workers_wanted: int | None = None
    requests_per_second: float | None = None
    error_ratio: float | None = None
    p99_seconds: float | None = None
    peer_links_up: int | None = None
    peer_links_total: int | None = None
    breakers_open: int | None = None
    upstreams_down: list[str] = field(default_factory=list)
    next_expiry_days: float | None = None
    next_expiry: str | None = None  # role and subject of that certificate
    generation: int | None = None
    digest: str | None = None


def address_of(cloud: Cloud) -> tuple[str, int] | None:
    """Where `cloud`'s status is asked: its metrics.listen (a wildcard host: its first
    frontend's host), None without one."""
    if cloud.metrics_listen is None:
        return None
    host, port = cloud.metrics_listen
    if host in ("", "0.0.0.0", "::"):
        fronts = cloud.frontends or ((cloud.peer,) if cloud.peer is not None else ())
        host = fronts[0].url.host if fronts else "127.0.0.1"
    return host, port


def fetch(address: tuple[str, int], timeout: float) -> Mapping[str, Any]:
    """GET /status.json at `address` (OSError, ValueError when it fails)."""
    host, port = address
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/status.json", headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(BODY_MAX + 1)
    finally:
        conn.close()
    if response.status != 200:
        raise ValueError(f"HTTP {response.status}")
    if len(body) > BODY_MAX:
        raise ValueError("answer too large")
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("not a status document")
    return doc


def row_of(cloud: str, address: str, doc: Mapping[str, Any], now: float) -> Row:
    """A cloud's line from its router's status document (whatever it holds: every value is
    checked and every name shortened)."""
    workers = _dict(doc.get("workers"))
    traffic = _dict(doc.get("traffic"))
    config = _dict(doc.get("config"))
    links = _dict(doc.get("peer_links"))
    upstreams = [u for u in _list(doc.get("upstreams")) if isinstance(u, dict)]
    down = [
        _text(u.get("upstream"))
        for u in upstreams
        if u.get("up") is False or u.get("breaker_open") is True
    ]
    row = Row(
        cloud=cloud,
        router="up",
        address=address,
        status=_text(doc.get("status")),
        version=_text(doc.get("version")),
        workers_running=_int(workers.get("running")),
        workers_wanted=_int(workers.get("wanted")),
        requests_per_second=_float(traffic.get("requests_per_second")),
        error_ratio=_float(traffic.get("error_ratio")),
        p99_seconds=_float(traffic.get("p99_seconds")),
        peer_links_up=_int(links.get("up")),
        peer_links_total=_int(links.get("total")),
        breakers_open=_int(doc.get("breakers_open")),
        upstreams_down=down,
        generation=_int(config.get("generation")),
        digest=_text(config.get("digest")),
    )
    soonest: tuple[float, str] | None = None
    for cert in _list(doc.get("certificates")):
        if not isinstance(cert, dict):
            continue
        not_after = _float(cert.get("not_after"))
        if not_after is not None and (soonest is None or not_after < soonest[0]):
            soonest = (not_after, f"{_text(cert.get('role'))} {_text(cert.get('subject'))}")
    if soonest is not None:
        row.next_expiry_days = round((soonest[0] - now) / 86400, 1)
        row.next_expiry = soonest[1]
    return row


def collect(catalog: Catalog, clouds: Sequence[str], timeout: float) -> list[Row]:
    """Every cloud's line, its router asked in parallel."""
    rows: dict[str, Row] = {}
    asked: dict[str, tuple[str, int]] = {}
    for name in clouds:
        address = address_of(catalog.clouds[name])
        if address is None:
            rows[name] = Row(name, "unmonitored", error="no metrics.listen")
        else:
            asked[name] = address

    def ask(name: str) -> Row:
        host, port = asked[name]
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            doc = fetch((host, port), timeout)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return Row(name, "down", address=where, error=_why(exc))
        return row_of(name, where, doc, time.time())

    if asked:
        with ThreadPoolExecutor(max_workers=min(32, len(asked))) as pool:
            for row in pool.map(ask, list(asked)):
                rows[row.cloud] = row
    return [rows[name] for name in clouds]


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, json.JSONDecodeError):
        return "not JSON"
    return _text(str(exc) or type(exc).__name__)


def problems(rows: Sequence[Row], expiry_days: float) -> list[str]:
    """What makes the exit status 1, one line each."""
    found = []
    for row in rows:
        if row.router == "down":
            found.append(f"{row.cloud}: router down at {row.address} ({row.error})")
            continue
        if row.router != "up":
            continue
        if row.breakers_open:
            found.append(f"{row.cloud}: {row.breakers_open} breaker(s) open")
        for upstream in row.upstreams_down[:10]:
            found.append(f"{row.cloud}: upstream {upstream} down")
        if row.next_expiry_days is not None and row.next_expiry_days < expiry_days:
            found.append(
                f"{row.cloud}: certificate {row.next_expiry} expires in "
                f"{row.next_expiry_days:g} days"
            )
    return found


def skew(rows: Sequence[Row]) -> list[str]:
    """Routers running different configs or versions (flagged, not a failure: a rolling
    update passes through it)."""
    found = []
    for what, key in (("config", "digest"), ("version", "version")):
        values: dict[str, list[str]] = {}
        for row in rows:
            value = getattr(row, key)
            if row.router == "up" and value:
                values.setdefault(value, []).append(row.cloud)
        if len(values) > 1:
            parts = "; ".join(f"{v}: {', '.join(c)}" for v, c in sorted(values.items()))
            found.append(f"{what} skew: {parts}")
    return found


HEADER = (
    "Cloud",
    "Router",
    "Workers",
    "Req/s",
    "Errors",
    "p99",
    "Peer links",
    "Breakers open",
    "Next cert expiry",
    "Config",
)


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.router != "up":
            out.append([r.cloud, f"{r.router} ({r.error})", *["-"] * (len(HEADER) - 2)])
            continue
        status = "up" if r.status == "ok" else f"up, {r.status}"
        out.append(
            [
                r.cloud,
                status,
                f"{_show(r.workers_running)}/{_show(r.workers_wanted)}",
                "-" if r.requests_per_second is None else f"{r.requests_per_second:.2f}",
                "-" if r.error_ratio is None else f"{r.error_ratio * 100:.2f}%",
                "-" if r.p99_seconds is None else f"{r.p99_seconds * 1000:.0f} ms",
                f"{_show(r.peer_links_up)}/{_show(r.peer_links_total)}",
                _show(r.breakers_open),
                "-" if r.next_expiry_days is None else f"{r.next_expiry_days:g} d",
                f"{_show(r.generation)} {r.digest or '-'}",
            ]
        )
    return out


def run(args: argparse.Namespace) -> int:
    catalog = load(args.config)
    if catalog is None:
        return 2
    names = list(catalog.clouds)
    if args.cloud:
        unknown = [c for c in args.cloud if c not in catalog.clouds]
        if unknown:
            print(
                f"scoperouter status: no cloud {_text(unknown[0])!r} in {args.config} "
                f"(clouds: {', '.join(sorted(catalog.clouds))})",
                file=sys.stderr,
            )
            return 2
        names = list(dict.fromkeys(args.cloud))
    rows = collect(catalog, names, args.timeout)
    found, skewed = problems(rows, args.expiry_days), skew(rows)
    if args.json:
        doc = {
            "ok": not found,
            "clouds": [asdict(row) for row in rows],
            "problems": found,
            "skew": skewed,
        }
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(HEADER, table_rows(rows)))
        for line in skewed:
            print(f"warning: {line}")
        for line in found:
            print(f"problem: {line}")
    return 1 if found else 0


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: Any) -> str:
    """A value from a router's answer as printed: printable characters only, shortened."""
    text = "".join(ch for ch in str(value) if ch.isprintable())
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 3] + "..."


def _show(value: object) -> str:
    return "-" if value is None else str(value)
