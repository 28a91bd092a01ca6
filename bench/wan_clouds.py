"""``bench.wan --clouds N``: the pure parts (no I/O, no root): the clouds' names and
addresses, the routers' federation config, the merged scope, the backends' glance-style lists,
the check of a merged answer, the issue-21 target's verdict, and where a merged request's time
goes according to the routers' access lines.

Where each cloud lives (CloudOne in namespace A, the others in B, across the delayed link):

=========  ====================  ======================  =====================
cloud      router frontend       peer link               backend
=========  ====================  ======================  =====================
CloudOne   127.0.0.2 (A)         https://10.250.0.1:9443 127.0.1.2:8001 (A)
CloudTwo   10.250.0.2 (B)        https://10.250.0.2:9443 127.0.1.3:8001 (B)
CloudK     10.250.0.K (B)        https://10.250.0.K:9443 127.0.1.(K+1):8001 (B)
=========  ====================  ======================  =====================

With two clouds this is the federation ``bench.wan`` has always run (the same config).
"""

from __future__ import annotations

import json
import statistics
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

A_ADDR, B_ADDR = "10.250.0.1", "10.250.0.2"
ROUTER_A = "127.0.0.2"  # CloudOne's router frontend, inside A
PORTS = {
    "plain": 8000,
    "tls": 8443,
    "backend": 8001,
    "router": 9292,
    "identity": 5000,
    "peer": 9443,
}
MAX_CLOUDS = 200  # 10.250.0.2-200 in B; 127.0.1.2-201 for the backends
IMAGES_PER_CLOUD = 5  # each backend's list: what one cloud's `openstack image list` might show
TARGET_CLOUDS = 10  # issue 21: `A & B` over 10 clouds ...
TARGET_DELAY_MS = 25.0  # ... 25 ms each way ...
TARGET_P50_MS = 60.0  # ... p50 of a merged list <= 60 ms (1.2x one round trip)

_WORDS = (
    "One",
    "Two",
    "Three",
    "Four",
    "Five",
    "Six",
    "Seven",
    "Eight",
    "Nine",
    "Ten",
    "Eleven",
    "Twelve",
    "Thirteen",
    "Fourteen",
    "Fifteen",
    "Sixteen",
    "Seventeen",
    "Eighteen",
    "Nineteen",
    "Twenty",
)


def cloud_names(n: int) -> list[str]:
    """CloudOne, CloudTwo, ... CloudTwenty, then Cloud21, Cloud22, ..."""
    if not 2 <= n <= MAX_CLOUDS:
        raise ValueError(f"--clouds must be from 2 to {MAX_CLOUDS}, not {n}")
    return [f"Cloud{_WORDS[i]}" if i < len(_WORDS) else f"Cloud{i + 1}" for i in range(n)]


def router_host(index: int) -> str:
    """The address of cloud `index`'s router frontend (0: CloudOne, in A; others in B)."""
    return ROUTER_A if index == 0 else f"10.250.0.{index + 1}"


def peer_host(index: int) -> str:
    """The address of cloud `index`'s peer link: its end of the WAN link."""
    return A_ADDR if index == 0 else f"10.250.0.{index + 1}"


def backend_host(index: int) -> str:
    """Cloud `index`'s backend, on the loopback of its namespace (A for CloudOne, else B)."""
    return f"127.0.1.{index + 2}"


def federation_config(
    names: Sequence[str], tls: bool, certs: Mapping[str, Path] | None, ca: Path | None
) -> dict[str, Any]:
    """The routers' federation: image and identity in every cloud. Plain: a router reaches
    another on its frontend (no peer links). TLS: each router has a peer link (https, a
    certificate of the bench's CA named in ``settings.peers.ca``, its key beside it), so
    CloudOne's router keeps warm connections to every other across the link."""
    settings: dict[str, Any] = {"connect_timeout": 10.0, "response_timeout": 30.0}
    if tls:
        assert certs is not None and ca is not None
        settings["peers"] = {"ca": str(ca)}
    clouds: dict[str, Any] = {}
    for index, name in enumerate(names):
        front = f"http://{router_host(index)}:{PORTS['router']}"
        identity = f"http://{router_host(index)}:{PORTS['identity']}"
        backend = f"http://{backend_host(index)}:{PORTS['backend']}"
        clouds[name] = {
            "region": name,
            "frontends": [{"url": front}, {"url": identity}],
            "services": {
                "image": {"public": {"url": front, "backend": backend}},
                "identity": {
                    "public": {"url": f"{identity}/v3", "backend": f"{backend}/identity/v3"}
                },
            },
        }
    if tls:
        assert certs is not None
        for index, name in enumerate(names):
            cert = certs[name]
            clouds[name]["peer"] = {
                "url": f"https://{peer_host(index)}:{PORTS['peer']}",
                "tls": {"cert": str(cert), "key": str(cert.with_suffix(".key"))},
            }
    return {"version": 1, "settings": settings, "clouds": clouds}


def merged_scope(clouds: Sequence[str]) -> str:
    """The scope of a merged image list over `clouds`, as a client sends it."""
    return json.dumps({"image": " & ".join(clouds)}, separators=(",", ":"))


def merged_sets(names: Sequence[str]) -> list[list[str]]:
    """The clouds of each merged list measured: every other cloud (a merge of the peers
    alone, when there are two or more of them), then all of them, CloudOne included."""
    others = list(names[1:])
    return [others, list(names)] if len(others) >= 2 else [list(names)]


def span(clouds: Sequence[str]) -> str:
    """`clouds` in a label: ``CloudTwo..CloudTen`` (or the one or two names)."""
    return " & ".join(clouds) if len(clouds) <= 2 else f"{clouds[0]}..{clouds[-1]}"


def image_ids(cloud: str, count: int = IMAGES_PER_CLOUD) -> list[str]:
    """The ids of `cloud`'s images on its backend (UUIDs, as glance's, the same every run)."""
    return [str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench.wan/{cloud}/{i}")) for i in range(count)]


def glance_list(cloud: str, count: int = IMAGES_PER_CLOUD) -> dict[str, Any]:
    """`cloud`'s backend's answer to ``GET /v2/images``: glance's shape (no next link: one
    page), each image with the fields glance lists."""
    images = [
        {
            "id": image_id,
            "name": f"{cloud.lower()}-image-{i}",
            "status": "active",
            "visibility": "public",
            "container_format": "bare",
            "disk_format": "qcow2",
            "size": 21430272 + i,
            "checksum": image_id.replace("-", ""),
            "min_disk": 0,
            "min_ram": 0,
            "protected": False,
            "tags": [],
            "created_at": "2024-05-01T10:00:00Z",
            "updated_at": "2024-05-01T10:00:00Z",
            "self": f"/v2/images/{image_id}",
            "file": f"/v2/images/{image_id}/file",
            "schema": "/v2/schemas/image",
        }
        for i, image_id in enumerate(image_ids(cloud, count))
    ]
    return {"images": images, "first": "/v2/images", "schema": "/v2/schemas/images"}


def check_merged(status: int, body: str, clouds: Sequence[str]) -> str | None:
    """Why a merged answer over `clouds` is not right, or None: 200, glance's list holding
    every cloud's images once, in the expression's order, each marked with its cloud
    (``x-scope-cloud``), and no next link (every backend answers one page)."""
    if status != 200:
        return f"status {status}: {body[:300]}"
    try:
        data = json.loads(body)
    except ValueError:
        return f"not JSON: {body[:300]}"
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list) or not all(isinstance(i, dict) for i in images):
        return f"no 'images' list: {body[:300]}"
    got = [(image.get("x-scope-cloud"), image.get("id")) for image in images]
    expected = [(cloud, image_id) for cloud in clouds for image_id in image_ids(cloud)]
    if got != expected:
        missing = sorted({c for c, i in expected if (c, i) not in got})
        extra = sorted({str(c) for c, i in got if (c, i) not in expected})
        if missing or extra:
            return (
                f"{len(got)} images, expected {len(expected)}"
                + (f"; missing items of {', '.join(missing)}" if missing else "")
                + (f"; unexpected items of {', '.join(extra)}" if extra else "")
            )
        return "every cloud's images are there, but not in the expression's order"
    if data.get("next"):
        return f"a next link where every cloud answered one page: {data['next']!r}"
    return None


def verdict(p50_ms: float | None, clouds: int, delay_ms: float) -> str:
    """The issue-21 target on one merged point: PASS or MISS at 10 clouds, 25 ms each way;
    "n/a" elsewhere (another number of clouds or delay is not the target's setting)."""
    if clouds != TARGET_CLOUDS or delay_ms != TARGET_DELAY_MS:
        return "n/a"
    if p50_ms is None:
        return "MISS"
    return "PASS" if p50_ms <= TARGET_P50_MS else "MISS"


def target_lines(
    points: Sequence[Mapping[str, Any]], clouds: int, delay_ms: float
) -> tuple[list[str], str]:
    """The target's lines under the table (one per merged point) and the overall verdict:
    PASS when every merged point passes (at every number of clients), MISS when one misses,
    n/a when the run is not at the target's setting (or measured no merged point)."""
    merged = [p for p in points if str(p["path"]).startswith("merged ") and "TLS" in p["path"]]
    if not merged:
        return [], "n/a"
    lines = []
    verdicts = []
    for p in merged:
        judged = verdict(p["p50_ms"], clouds, delay_ms)
        verdicts.append(judged)
        p50 = "-" if p["p50_ms"] is None else f"{p['p50_ms']:.1f} ms"
        clients = f"{p['concurrency']} client{'' if p['concurrency'] == 1 else 's'}"
        lines.append(f"- {p['path']}, {clients}: p50 {p50}: {judged}")
    if "n/a" in verdicts:
        overall = "n/a"
    else:
        overall = "PASS" if all(v == "PASS" for v in verdicts) else "MISS"
    setting = (
        ""
        if overall != "n/a"
        else f" (not judged: measured at {clouds} clouds, {delay_ms:g} ms each way)"
    )
    head = (
        f"Target (issue 21): a merged list over {TARGET_CLOUDS} clouds, "
        f"{TARGET_DELAY_MS:g} ms each way, TLS peer links: p50 <= {TARGET_P50_MS:g} ms: "
        f"**{overall}**{setting}"
    )
    return [head, *lines], overall


# --- where the time goes: the routers' access lines (--router-log-level INFO) ---------------


@dataclass(frozen=True)
class Timeline:
    """Medians over a point's merged requests, in ms, from the routers' own access lines (each
    line's time stamp is when the router answered, to the millisecond; its ``ms`` how long it
    took): CloudOne's router's time; when the parts reach their routers, after CloudOne's
    router read the request (first and last part, and the spread between them: the parts are
    sent at once when it is small against the link's delay); the slowest part's time in its
    router (its backend included); and from the last part's answer leaving its router to the
    end of CloudOne's (the way back across the link, reading the answers and merging them)."""

    requests: int
    router_ms: float
    first_part_at_ms: float
    last_part_at_ms: float
    spread_ms: float
    slowest_part_ms: float
    back_ms: float

    def text(self) -> str:
        return (
            f"CloudOne's router {self.router_ms:.1f} ms per request; the parts reach their "
            f"routers {self.first_part_at_ms:.1f}-{self.last_part_at_ms:.1f} ms after it read "
            f"the request ({self.spread_ms:.1f} ms between the first and the last); the slowest "
            f"part {self.slowest_part_ms:.1f} ms in its router; from its answer to the end of "
            f"CloudOne's {self.back_ms:.1f} ms (the way back, reading, merging); "
            f"{self.requests} requests, +-1 ms"
        )


def _access(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if '"scoperouter.access"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "request_id" in entry and "ms" in entry:
            yield entry


def _stamp_ms(entry: Mapping[str, Any]) -> float:
    when = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return when.timestamp() * 1000


def timeline(
    one: Iterable[str], others: Iterable[str], since_ms: float | None = None
) -> Timeline | None:
    """The :class:`Timeline` of the merged requests among CloudOne's router's log lines `one`
    (those that started at `since_ms`, epoch milliseconds, or later), their parts found among
    the other routers' lines `others` (a request's parts carry its request id); None when no
    merged request had its parts' lines."""
    parts: dict[str, list[dict[str, Any]]] = {}
    for entry in _access(others):
        parts.setdefault(entry["request_id"], []).append(entry)
    rows: list[tuple[float, ...]] = []
    for entry in _access(one):
        found = parts.get(entry["request_id"])
        if entry.get("decision") != "fanout" or not found:
            continue
        end = _stamp_ms(entry)
        start = end - entry["ms"]
        if since_ms is not None and start < since_ms:
            continue  # a warm-up request
        arrivals = [_stamp_ms(p) - p["ms"] - start for p in found]
        leaving = max(_stamp_ms(p) for p in found)
        rows.append(
            (
                entry["ms"],
                min(arrivals),
                max(arrivals),
                max(arrivals) - min(arrivals),
                max(p["ms"] for p in found),
                end - leaving,
            )
        )
    if not rows:
        return None
    medians = [round(statistics.median(column), 1) for column in zip(*rows, strict=True)]
    return Timeline(len(rows), *medians)
