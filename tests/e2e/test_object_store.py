"""Object storage (swift) through the routers: a CloudOne user's objects in CloudTwo's swift,
scope ``{"object-store": "CloudTwo"}`` on the token, sent to CloudOne's router.

The request crosses two routers (CloudOne's, then CloudTwo's over the peer link) and reaches
CloudTwo's swift proxy, whose keystone middleware validates the CloudOne token through
CloudTwo's router, which sends the validation to CloudOne's keystone: the account is the
CloudOne project's, ``AUTH_<project id>``, in CloudTwo too. Large bodies stream through both
routers (their memory is sampled while 100 MiB go up and come back), large objects (SLO, DLO)
are assembled by CloudTwo's proxy, and ``Range`` reads come back as swift answers them.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.labservices import (
    require_service,
    router_record,
    scoped_token,
    wait_until,
)
from tests.e2e.memory import RSSSampler
from tests.e2e.osc import cli

pytestmark = pytest.mark.e2e

BIG_MB = 100
CHUNK = 1 << 20
# A router streams: it holds a few reads of a body, never the body. Buffering 100 MiB would add
# at least that much to one router's memory; this bound leaves room for the allocator's noise.
RSS_GROWTH_MB = 24


@pytest.fixture(scope="module")
def swift(lab, fed):
    """(CloudOne, CloudTwo, a session, CloudOne's demo token and the project's account URL at
    CloudOne's router)."""
    require_service(lab, "swift")
    one, two, _ = fed
    token = lab.osc(one.slug, "token", "issue")
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: straight to the router
    if one.tls:  # a TLS lab (`lab up --tls`): the router's https frontend, the lab's CA
        session.verify = str(lab.paths.ca_cert)
    account = f"{one.frontend_url('object-store')}/v1/AUTH_{token['project_id']}"
    return one, two, session, token["id"], account


@pytest.fixture
def container(swift):
    """A container of the CloudOne project in CloudTwo's swift, emptied and deleted after."""
    _, two, session, token, account = swift
    headers = {"X-Auth-Token": scoped_token(token, **{"object-store": two.name})}
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    made = []
    for suffix in ("", "_segments"):
        url = f"{account}/{name}{suffix}"
        assert session.put(url, headers=headers, timeout=60).status_code in (201, 202)
        made.append(url)
    yield name
    for url in made:
        listing = session.get(url, headers=headers, params={"format": "json"}, timeout=60)
        for obj in listing.json() if listing.status_code == 200 else []:
            session.delete(f"{url}/{obj['name']}", headers=headers, timeout=60)
        session.delete(url, headers=headers, timeout=60)


def _stream(total: int, digest: dict[str, hashlib._Hash]) -> Iterator[bytes]:
    """`total` bytes in 1 MiB chunks (a hash chain: nothing compressible, nothing held),
    hashed into `digest` as they are produced."""
    block = hashlib.sha256(b"scoperouter e2e object").digest()
    sent = 0
    while sent < total:
        chunk = bytearray()
        while len(chunk) < min(CHUNK, total - sent):
            block = hashlib.sha256(block).digest()
            chunk += block * 64
        data = bytes(chunk[: min(CHUNK, total - sent)])
        for h in digest.values():
            h.update(data)
        sent += len(data)
        yield data


def test_100mb_object_through_two_routers_streams(lab, swift, container):
    """100 MiB up and back through CloudOne's and CloudTwo's routers: the same bytes (swift's
    ETag and our own hashes), the object in CloudTwo's swift only, and neither router's memory
    grows by anything like the object (each sampled while the bytes pass)."""
    one, two, session, token, account = swift
    scoped = {"X-Auth-Token": scoped_token(token, **{"object-store": two.name})}
    url = f"{account}/{container}/big.bin"
    sent = {"md5": hashlib.md5(), "sha256": hashlib.sha256()}
    routers = [router_record(lab, one), router_record(lab, two)]
    since = {c.name: _size(lab.paths.log(c, "router")) for c in (one, two)}
    with (
        RSSSampler(measure=routers[0].rss, interval=0.05) as rss_one,
        RSSSampler(measure=routers[1].rss, interval=0.05) as rss_two,
    ):
        t0 = time.monotonic()
        put = session.put(url, headers=scoped, data=_stream(BIG_MB * CHUNK, sent), timeout=600)
        t_put = time.monotonic() - t0
        assert put.status_code == 201, put.text[:500]
        got = {"md5": hashlib.md5(), "sha256": hashlib.sha256()}
        size = 0
        t0 = time.monotonic()
        with session.get(url, headers=scoped, stream=True, timeout=600) as answer:
            assert answer.status_code == 200, answer.text[:500]
            for chunk in answer.iter_content(CHUNK):
                size += len(chunk)
                for h in got.values():
                    h.update(chunk)
        t_get = time.monotonic() - t0
    print(
        f"\n{BIG_MB} MiB through two routers: PUT {t_put:.1f} s, GET {t_get:.1f} s; router RSS "
        f"{one.name} {rss_one.describe()}, {two.name} {rss_two.describe()}"
    )
    assert size == BIG_MB * CHUNK
    assert put.headers["Etag"].strip('"') == sent["md5"].hexdigest()
    assert answer.headers["Etag"].strip('"') == sent["md5"].hexdigest()
    assert got["sha256"].hexdigest() == sent["sha256"].hexdigest()
    for name, rss in ((one.name, rss_one), (two.name, rss_two)):
        grown = (rss.peak - rss.start) / 2**20
        assert grown < RSS_GROWTH_MB, f"{name}'s router: {rss.describe()}"
    # the object is CloudTwo's: the same URL without the scope is CloudOne's swift, which has
    # no such container; with the scope, HEAD shows its size
    plain = session.head(url, headers={"X-Auth-Token": token}, timeout=60)
    assert plain.status_code == 404
    head = session.head(url, headers=scoped, timeout=60)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == BIG_MB * CHUNK
    # both routers carried the transfer: CloudOne's to CloudTwo's, CloudTwo's to its swift
    path = url.removeprefix(one.frontend_url("object-store"))
    # (a router writes a request's access line once the answer is out: wait for it)
    for cloud, decision in ((one, "remote"), (two, "local")):

        def carried(cloud=cloud, decision=decision) -> set[tuple[str, int]]:
            entries = _access_entries(lab, cloud, since[cloud.name])
            seen = {(e["method"], e["status"]) for e in entries
                    if e.get("path") == path and e.get("decision") == decision}  # fmt: skip
            return seen if {("PUT", 201), ("GET", 200)} <= seen else set()

        wait_until(f"{cloud.name}'s router logging the PUT and the GET", carried, 20)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _access_entries(lab, cloud, since: int) -> list[dict]:
    with lab.paths.log(cloud, "router").open("rb") as fh:
        fh.seek(since)
        lines = fh.read().decode(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line[:1] == "{"]


def test_static_large_object_with_ranges(swift, container):
    """An SLO of three segments: the manifest is checked and stored by CloudTwo's proxy, a GET
    returns the segments joined, a Range across a segment boundary and a suffix range come
    back as 206 with exactly those bytes, and several ranges as multipart/byteranges."""
    _, two, session, token, account = swift
    scoped = {"X-Auth-Token": scoped_token(token, **{"object-store": two.name})}
    segments = [bytes([65 + i]) * (CHUNK + i * 1000) for i in range(3)]  # A..., B..., C...
    manifest = []
    for i, data in enumerate(segments):
        path = f"/{container}_segments/slo/{i:03d}"
        put = session.put(f"{account}{path}", headers=scoped, data=data, timeout=120)
        assert put.status_code == 201, put.text[:500]
        manifest.append({"path": path, "etag": hashlib.md5(data).hexdigest(),
                         "size_bytes": len(data)})  # fmt: skip
    url = f"{account}/{container}/slo.bin"
    put = session.put(url, headers=scoped, params={"multipart-manifest": "put"},
                      data=json.dumps(manifest), timeout=120)  # fmt: skip
    assert put.status_code == 201, put.text[:500]
    whole = b"".join(segments)
    got = session.get(url, headers=scoped, timeout=120)
    assert got.status_code == 200 and got.content == whole
    assert got.headers.get("X-Static-Large-Object") == "True"
    # SLO's ETag: the MD5 of the segments' ETags
    slo_etag = hashlib.md5("".join(s["etag"] for s in manifest).encode()).hexdigest()
    assert got.headers["Etag"].strip('"') == slo_etag
    start = len(segments[0]) - 10  # the last 10 bytes of A and the first 20 of B
    ranged = session.get(url, headers={**scoped, "Range": f"bytes={start}-{start + 29}"},
                         timeout=60)  # fmt: skip
    assert ranged.status_code == 206
    assert ranged.content == whole[start : start + 30] == b"A" * 10 + b"B" * 20
    assert ranged.headers["Content-Range"] == f"bytes {start}-{start + 29}/{len(whole)}"
    suffix = session.get(url, headers={**scoped, "Range": "bytes=-5"}, timeout=60)
    assert suffix.status_code == 206 and suffix.content == b"C" * 5
    multi = session.get(url, headers={**scoped, "Range": "bytes=0-1,-2"}, timeout=60)
    assert multi.status_code == 206
    assert multi.headers["Content-Type"].startswith("multipart/byteranges")
    assert b"AA" in multi.content and b"CC" in multi.content
    # the manifest itself, as stored
    raw = session.get(url, headers=scoped, params={"multipart-manifest": "get"}, timeout=60)
    assert [s["name"] for s in raw.json()] == [m["path"] for m in manifest]


def test_dynamic_large_object(swift, container):
    """A DLO: segments under a prefix, a manifest naming it; the GET joins them in name order,
    and a Range inside the second segment reads only those bytes."""
    _, two, session, token, account = swift
    scoped = {"X-Auth-Token": scoped_token(token, **{"object-store": two.name})}
    parts = [b"first-" * 1000, b"second-" * 1000, b"third-" * 1000]
    for i, data in enumerate(parts):
        put = session.put(f"{account}/{container}_segments/dlo/{i:03d}", headers=scoped,
                          data=data, timeout=60)  # fmt: skip
        assert put.status_code == 201
    url = f"{account}/{container}/dlo.bin"
    manifest = {**scoped, "X-Object-Manifest": f"{container}_segments/dlo/"}
    assert session.put(url, headers=manifest, data=b"", timeout=60).status_code == 201
    got = session.get(url, headers=scoped, timeout=60)
    assert got.status_code == 200 and got.content == b"".join(parts)
    assert got.headers["X-Object-Manifest"] == f"{container}_segments/dlo/"
    at = len(parts[0]) + 7
    ranged = session.get(url, headers={**scoped, "Range": f"bytes={at}-{at + 6}"}, timeout=60)
    assert ranged.status_code == 206 and ranged.content == b"second-"


def test_cli_lists_the_containers_of_the_scoped_cloud(lab, swift, container):
    """`openstack --os-scope '{"object-store": "CloudTwo"}' container list` (the CLI and its
    SDK, from the token's catalog: the object-store URL with the project's id filled in) lists
    the container made in CloudTwo; without the scope, CloudOne's swift has no such one."""
    one, two, _, _, _ = swift
    scope = json.dumps({"object-store": two.name})
    scoped = {c["Name"] for c in cli(lab, one.slug, "container", "list", scope=scope)}
    assert {container, f"{container}_segments"} <= scoped
    plain = {c["Name"] for c in cli(lab, one.slug, "container", "list")}
    assert container not in plain
