"""100 MB through two routers, both ways: bodies arrive intact and stream (router RSS stays
flat), because routing happens on the request headers and bodies over 1 MiB are streamed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from .backends import blob_chunks, blob_sha256
from .conftest import Federation
from .routers import download, request, sample_rss

pytestmark = pytest.mark.integration

SIZE = 100 * 1024 * 1024
RSS_LIMIT = 100 * 1024 * 1024  # absolute ceiling per router process
RSS_GROWTH = 30 * 1024 * 1024  # a buffered 100 MB body would blow far past this
SCOPE = {"X-Auth-Token": 'tok!SCOPE!{"image": "CloudTwo"}'}


@contextmanager
def peak_rss(pids: list[int]) -> Iterator[dict[int, int]]:
    """Peak RSS of each process while the block runs (sampled every 20 ms)."""
    peaks: dict[int, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(pids, stop, peaks), daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join(timeout=5)


def assert_flat(peaks: dict[int, int], before: dict[int, int]) -> None:
    for pid, peak in peaks.items():
        assert peak < RSS_LIMIT, f"router {pid}: peak RSS {peak >> 20} MiB"
        growth = peak - before[pid]
        assert growth < RSS_GROWTH, f"router {pid}: RSS grew by {growth >> 20} MiB"


@pytest.fixture
def router_pids(federation: Federation) -> list[int]:
    return [federation.routers["CloudOne"].pid, federation.routers["CloudTwo"].pid]


def test_100mb_upload_through_two_routers(federation: Federation, router_pids: list[int]) -> None:
    url = federation.url("CloudOne", "image", "/v2/images/big/file")
    headers = {**SCOPE, "Content-Length": str(SIZE), "Content-Type": "application/octet-stream"}
    before = {pid: psutil.Process(pid).memory_info().rss for pid in router_pids}
    with peak_rss(router_pids) as peaks:
        reply = request("PUT", url, headers=headers, body=blob_chunks(SIZE), timeout=120)
    assert reply.status == 200, reply.body[:500]
    seen = reply.json()
    assert seen["backend"] == "CloudTwo-image"
    assert seen["body_length"] == SIZE
    assert seen["body_sha256"] == blob_sha256(SIZE)
    assert_flat(peaks, before)


def test_100mb_chunked_upload_through_two_routers(
    federation: Federation, router_pids: list[int]
) -> None:
    url = federation.url("CloudOne", "image", "/v2/images/big/file")
    before = {pid: psutil.Process(pid).memory_info().rss for pid in router_pids}
    with peak_rss(router_pids) as peaks:
        # No Content-Length: http.client sends the generator with Transfer-Encoding: chunked.
        reply = request("PUT", url, headers=SCOPE, body=blob_chunks(SIZE), timeout=120)
    assert reply.status == 200, reply.body[:500]
    assert reply.json()["body_length"] == SIZE
    assert reply.json()["body_sha256"] == blob_sha256(SIZE)
    assert_flat(peaks, before)


def test_100mb_download_through_two_routers(federation: Federation, router_pids: list[int]) -> None:
    url = federation.url("CloudOne", "image", f"/v2/images/big/blob/{SIZE}")
    before = {pid: psutil.Process(pid).memory_info().rss for pid in router_pids}
    with peak_rss(router_pids) as peaks:
        status, length, sha = download(url, SCOPE, timeout=120)
    assert (status, length) == (200, SIZE)
    assert sha == blob_sha256(SIZE)
    assert_flat(peaks, before)
    seen = federation.backends[("CloudTwo", "image")].seen
    assert any(item["path"] == f"/v2/images/big/blob/{SIZE}" for item in seen)
