"""The routers' status page in headless Chromium (Debian's `chromium`) and `scoperouter status`
against the lab: every cloud and peer link on the page (a screenshot kept as a CI artifact in
$SCOPEROUTER_ARTIFACTS), a stopped backend's breaker open on the page within seconds, and a
stopped router shown down with exit status 1; each part restarted and the lab whole again.

Run: `pytest -m e2e tests/e2e/test_status.py -n 0` (a lab up: `scoperouter lab up`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scoperouter_lab.files import DOWN_CLOUD
from scoperouter_lab.layout import CloudSpec

from tests.ci import missing
from tests.e2e.conftest import Lab
from tests.e2e.labservices import wait_until

pytestmark = pytest.mark.e2e

CHROMIUM_TIMEOUT = 90


def artifacts() -> Path:
    """Where screenshots go: $SCOPEROUTER_ARTIFACTS (.ci/run: its reports), else a tmp dir."""
    where = os.environ.get("SCOPEROUTER_ARTIFACTS") or os.path.join(
        tempfile.gettempdir(), "scoperouter-artifacts"
    )
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("chromium is not installed (apt-get install chromium)")  # CI=true: a failure
    assert found is not None
    return found


def _chromium(binary: str, *args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="scoperouter-chromium-") as profile:
        argv = [
            binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-proxy-server",
            f"--user-data-dir={profile}",
            *args,
        ]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT, check=False
        )
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


def dom(binary: str, url: str) -> str:
    """The page at `url` as Chromium built it (--dump-dom)."""
    return _chromium(binary, "--dump-dom", url)


def screenshot(binary: str, url: str, path: Path, size: str) -> None:
    _chromium(binary, f"--screenshot={path}", f"--window-size={size}", "--hide-scrollbars", url)
    assert path.stat().st_size > 1000, f"{path}: no screenshot"


def status_url(cloud: CloudSpec, page: str = "/status") -> str:
    return f"http://{cloud.metrics_listen}{page}"


def status_json(cloud: CloudSpec) -> dict[str, Any]:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        status_url(cloud, "/status.json"), timeout=10
    ) as answer:
        doc: dict[str, Any] = json.load(answer)
    return doc


def cli(lab: Lab) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "scoperouter.cli", "status", "--json"]
    argv += ["--config", str(lab.paths.federation_yaml), "--timeout", "5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def control(lab: Lab) -> Iterator[Any]:
    """The lab's own code, to stop and start its processes as `lab up` does."""
    if not lab.routed or len(lab.clouds) < 2:
        missing("needs a routed lab of at least two clouds")
    from scoperouter_lab.lab import Lab as LabControl

    with open(os.devnull, "w") as quiet:
        yield LabControl(lab.root, out=quiet)


def test_the_status_page_in_chromium_shows_every_cloud_and_peer_link(
    lab: Lab, chromium: str
) -> None:
    one = lab.clouds[0]
    page = dom(chromium, status_url(one))
    assert f'data-cloud="{one.name}"' in page and 'id="status" class="ok"' in page
    for other in [*lab.clouds[1:], None]:
        name = DOWN_CLOUD if other is None else other.name
        assert f'data-cloud="{name}" data-kind="peer"' in page, f"no peer link to {name}"
    assert 'data-kind="backend"' in page
    if lab.state.get("tls"):
        assert 'class="certificate"' in page
    shots = artifacts()
    screenshot(chromium, status_url(one), shots / "status.png", "1280,1400")
    screenshot(chromium, status_url(one), shots / "status-phone.png", "390,1600")
    for cloud in lab.clouds:
        assert status_json(cloud)["cloud"] == cloud.name


def _poll(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    return wait_until(what, check, timeout=timeout)


def _image_root(cloud: CloudSpec) -> int:
    """GET / of the cloud's image frontend (glance's version list: no token needed)."""
    url = f"{cloud.scheme}://{cloud.front_ip}:9292/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_stopped_backend_shows_its_breaker_open_on_the_page(
    lab: Lab, chromium: str, control: Any
) -> None:
    from scoperouter_lab.cloud import Step

    two = lab.clouds[1]
    backend = f"{two.scheme}://{two.back_ip}:9292"
    runner = control.runner(two, Step(report=lambda label, result, took: None))
    control.procs.stop(runner.pname("glance"))
    try:
        assert _image_root(two) in (502, 503, 504)
        started = time.monotonic()

        def shown_open() -> bool:
            page = dom(chromium, status_url(two))
            return f'data-upstream="{backend}" data-breaker="open" data-up="down"' in page

        _poll("the glance breaker shown open on CloudTwo's page", shown_open)
        print(f"breaker shown open {time.monotonic() - started:.1f} s after the failure")
        screenshot(chromium, status_url(two), artifacts() / "status-breaker-open.png", "1280,1400")
    finally:
        runner._start("glance")
        runner.wait_ready("glance")
    # the next probe (after breaker.down_for) closes it again, in each worker that opened it
    # (requests reach the router's workers at random: each poll sends one)
    _poll("glance answering through CloudTwo's router", lambda: _image_root(two) < 400, 120)

    def closed() -> bool:
        upstreams = status_json(two)["upstreams"]
        shown = any(u["upstream"] == backend and u["breaker_open"] for u in upstreams)
        return _image_root(two) < 400 and not shown

    _poll("the glance breaker closed again", closed, 90)


def test_scoperouter_status_shows_the_lab_and_a_stopped_router(lab: Lab, control: Any) -> None:
    one, two = lab.clouds[0], lab.clouds[1]
    _, doc = cli(lab)
    rows = {row["cloud"]: row for row in doc["clouds"]}
    for cloud in lab.clouds:
        assert rows[cloud.name]["router"] == "up", rows[cloud.name]
    assert rows[DOWN_CLOUD]["router"] == "unmonitored"  # no router, no metrics listener
    assert not [p for p in doc["problems"] if "router down" in p]
    assert doc["skew"] == []  # one config, one version
    control.procs.stop(f"{two.slug}-router")
    try:
        code, doc = cli(lab)
        assert code == 1
        rows = {row["cloud"]: row for row in doc["clouds"]}
        assert rows[two.name]["router"] == "down" and rows[one.name]["router"] == "up"
        assert any(p.startswith(f"{two.name}: router down at") for p in doc["problems"])
    finally:
        control._ensure_router(two)
    _poll(
        "both routers up again",
        lambda: all(r["router"] == "up" for r in cli(lab)[1]["clouds"] if r["cloud"] != DOWN_CLOUD),
        60,
    )
    assert _image_root(two) < 400  # the lab whole again
