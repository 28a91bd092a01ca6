"""The status page (``/status``): :func:`render` makes its HTML from the document of
:func:`~.status.status_document`, the same data as ``/status.json``.

One self-contained page: inline CSS, no script, no external asset (it refreshes itself with
a ``meta refresh`` every :data:`REFRESH` seconds); one column on a phone (under 600 px).
Every value from the config or the metrics (a cloud's name, an upstream, a certificate's
subject) is data: written through :func:`html.escape`, never as markup.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

REFRESH = 5  # seconds
ROWS_MAX = 500  # rows of one table (problems first); the JSON has them all

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;padding:12px;color:#1b1f23;background:#f6f8fa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:0 0 8px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:10px;
overflow-x:auto}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 6px;
border-bottom:1px solid #eaeef2;white-space:nowrap}th{font-weight:600}
.ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}
.warn{color:#9a6700;font-weight:600}.muted{color:#57606a}
#upstreams-section{grid-column:1/-1}.kv td{white-space:normal}
.kv td:first-child{color:#57606a;white-space:nowrap}
@media (max-width:600px){.grid{grid-template-columns:1fr}body{padding:6px}}
"""


def render(doc: Mapping[str, Any]) -> str:
    """The page of a status document (every value escaped)."""
    cloud = _e(doc.get("cloud", ""))
    status = str(doc.get("status", ""))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="refresh" content="{REFRESH}">',
        f"<title>{cloud}: scoperouter status</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<h1 id="cloud" data-cloud="{cloud}">Router of {cloud}</h1>',
        f'<p class="muted">status <span id="status" class="{_good(status == "ok")}">'
        f"{_e(status)}</span> &middot; scoperouter {_e(doc.get('version', ''))} "
        f"({_e(doc.get('build', ''))}, {_e(doc.get('event_loop', ''))}) &middot; "
        f"sampled {_time(doc.get('sampled_at'))} &middot; refreshes every {REFRESH} s &middot; "
        '<a href="/status.json">JSON</a> &middot; <a href="/metrics">metrics</a></p>',
        '<div class="grid">',
        _router(doc),
        _traffic(doc),
        _upstreams(doc.get("upstreams", [])),
        _routes(doc.get("routes", []), doc.get("latency", [])),
        _certificates(doc.get("certificates", [])),
        _refusals(doc.get("refusals", []), doc.get("forward_proxy", {})),
        "</div></body></html>",
    ]
    return "\n".join(parts)


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _good(ok: bool) -> str:
    return "ok" if ok else "bad"


def _time(unix: Any) -> str:
    if not isinstance(unix, int | float) or unix <= 0:
        return "-"
    when = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any, digits: int = 2, unit: str = "") -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}f}{unit}"


def _ms(seconds: Any) -> str:
    return _num(seconds * 1000 if isinstance(seconds, int | float) else None, 1, " ms")


def _pct(ratio: Any) -> str:
    return _num(ratio * 100 if isinstance(ratio, int | float) else None, 2, " %")


def _table(ident: str, header: Sequence[str], rows: Iterable[str], empty: str, total: int) -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="muted" id="{ident}-empty">{_e(empty)}</p>'
    more = (
        f'<p class="muted">{total - ROWS_MAX} more in <a href="/status.json">the JSON</a></p>'
        if total > ROWS_MAX
        else ""
    )
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'


def _section(title: str, ident: str, content: str) -> str:
    return f'<section id="{ident}-section"><h2>{_e(title)}</h2>{content}</section>'


def _router(doc: Mapping[str, Any]) -> str:
    workers = doc.get("workers", {})
    config = doc.get("config", {})
    running, wanted = workers.get("running", 0), workers.get("wanted", 0)
    rows = [
        (
            "workers",
            f'<span id="workers" class="{_good(running == wanted)}">{running}/{wanted}</span>'
            f" running, {_e(workers.get('restarts', 0))} restarts",
        ),
        ("config generation", f'<span id="generation">{_e(config.get("generation", ""))}</span>'),
        ("config loaded", _time(config.get("loaded_at"))),
        ("config digest", f'<code id="digest">{_e(config.get("digest", ""))}</code>'),
    ]
    for process in workers.get("processes", []):
        ready = bool(process.get("ready"))
        rows.append(
            (
                f"worker {_e(process.get('worker', ''))}",
                f"pid {_e(process.get('pid', '-'))}, "
                f'<span class="{_good(ready)}">{"ready" if ready else "not ready"}</span>, '
                f"{_e(process.get('restarts', 0))} restarts",
            )
        )
    body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return _section("Router", "router", f'<table class="kv">{body}</table>')


def _traffic(doc: Mapping[str, Any]) -> str:
    t = doc.get("traffic", {})
    rows = [
        ("requests/s", _num(t.get("requests_per_second"), 2)),
        ("error ratio (5xx)", _pct(t.get("error_ratio"))),
        ("p50", _ms(t.get("p50_seconds"))),
        ("p99", _ms(t.get("p99_seconds"))),
        ("open client connections", _num(t.get("open_connections"), 0)),
        (
            "over",
            f"the last {_num(t.get('rate_window_seconds'), 0)} s (requests/s), "
            f"{_num(t.get('window_seconds'), 0)} s (errors, latency)",
        ),
    ]
    body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return _section("Traffic", "traffic", f'<table class="kv" id="traffic">{body}</table>')


def _upstreams(upstreams: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for u in upstreams[:ROWS_MAX]:
        up, open_ = bool(u.get("up")), bool(u.get("breaker_open"))
        handshakes = u.get("handshakes_on_request_path")
        rows.append(
            f'<tr class="upstream" data-cloud="{_e(u.get("cloud", ""))}" '
            f'data-kind="{_e(u.get("kind", ""))}" data-upstream="{_e(u.get("upstream", ""))}" '
            f'data-breaker="{"open" if open_ else "closed"}" data-up="{"up" if up else "down"}">'
            f"<td>{_e(u.get('cloud', ''))}</td><td>{_e(u.get('kind', ''))}</td>"
            f"<td>{_e(u.get('upstream', ''))}</td>"
            f"<td>{_e(', '.join(u.get('services', [])))}</td>"
            f'<td class="{_good(up)}">{"up" if up else "down"}</td>'
            f'<td class="{_good(not open_)}">{"open" if open_ else "closed"}</td>'
            f"<td>{_num(u.get('open_connections'), 0)}/{_num(u.get('idle_connections'), 0)}</td>"
            f"<td>{_num(handshakes, 0) if handshakes is not None else ''}</td></tr>"
        )
    header = ("cloud", "kind", "upstream", "services", "state", "breaker", "open/idle", "hs")
    table = _table("upstreams", header, rows, "no upstream in the config", len(upstreams))
    note = (
        '<p class="muted">hs: connections to a peer router a request waited for (TCP+TLS '
        "handshakes on the request path, since start)</p>"
    )
    return _section("Upstreams (backends and peer links)", "upstreams", table + note)


def _routes(routes: Sequence[Mapping[str, Any]], latency: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f"<tr><td>{_service(r.get('service', ''))}</td><td>{_e(r.get('cloud', ''))}</td>"
        f"<td>{_num(r.get('requests_per_second'), 2)}</td>"
        f'<td class="{_good(not r.get("errors"))}">{_pct(r.get("error_ratio"))}</td></tr>'
        for r in routes[:ROWS_MAX]
    ]
    table = _table(
        "routes",
        ("service", "to cloud", "req/s", "errors"),
        rows,
        "no requests in the window",
        len(routes),
    )
    lat_rows = [
        f"<tr><td>{_e(r.get('service', ''))}</td><td>{_ms(r.get('p50_seconds'))}</td>"
        f"<td>{_ms(r.get('p99_seconds'))}</td></tr>"
        for r in latency[:ROWS_MAX]
    ]
    lat = _table("latency", ("service", "p50", "p99"), lat_rows, "", len(latency))
    return _section("Requests by service and destination cloud", "routes", table + lat)


def _service(name: Any) -> str:
    """A service type; ``-`` (no service: refused before routing) said so."""
    return "(refused)" if name == "-" else _e(name)


def _certificates(certs: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for c in certs[:ROWS_MAX]:
        days = c.get("days_left", 0)
        kind = "bad" if days < 14 else "warn" if days < 30 else "ok"
        rows.append(
            f'<tr class="certificate"><td>{_e(c.get("role", ""))}</td>'
            f"<td>{_e(c.get('subject', ''))}</td><td>{_time(c.get('not_after'))}</td>"
            f'<td class="{kind}">{_num(days, 1)}</td></tr>'
        )
    table = _table(
        "certificates",
        ("role", "subject", "expires", "days"),
        rows,
        "no certificate in the config",
        len(certs),
    )
    return _section("Certificates", "certificates", table)


def _refusals(refusals: Sequence[Mapping[str, Any]], proxy: Mapping[str, Any]) -> str:
    rows = [
        f'<tr class="refusal"><td>{_e(r.get("reason", ""))}</td>'
        f"<td>{_num(r.get('count'), 0)}</td><td>{_num(r.get('total'), 0)}</td></tr>"
        for r in refusals[:ROWS_MAX]
    ]
    table = _table(
        "refusals",
        ("reason", "in the window", "since start"),
        rows,
        "no refusal in the window",
        len(refusals),
    )
    if proxy.get("enabled"):
        intercepts = "intercepts TLS" if proxy.get("intercepts") else "no interception"
        forward = (
            f'<p id="forward-proxy">Forward proxy: {intercepts}; '
            f"{_num(proxy.get('certificates_minted'), 0)} certificates minted, "
            f"{_num(proxy.get('cache_size'), 0)} cached</p>"
        )
    else:
        forward = '<p id="forward-proxy" class="muted">No forward proxy.</p>'
    return _section("Refusals and forward proxy", "refusals", table + forward)
