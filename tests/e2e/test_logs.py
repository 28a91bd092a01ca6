"""No log of the lab holds a secret or a token: every file under <lab>/logs (the routers', every
OpenStack service's, the lab's own setup logs) is scanned for the lab's passwords and for the
tokens of requests this test sends through the routers, across clouds; and for anything shaped
like a keystone Fernet token, whoever's it was. The routers' access lines of those requests are
there, with their request ids, and say nothing more.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scoperouter.client import scope_session

pytestmark = pytest.mark.e2e

FERNET = re.compile(rb"gAAAAA[A-Za-z0-9_=-]{60,}")
MIN_SECRET = 8  # shorter values ("admin") would match ordinary words


def lab_secrets(lab: Any) -> set[str]:
    """Every password and credential secret the lab made, wherever it keeps them."""
    found: set[str] = set()

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str):
            yield value

    for key in ("secrets", "cloud_secrets"):
        found.update(strings(lab.state.get(key, {})))
    files = [lab.clouds_yaml, *sorted(lab.paths.root.glob("etc/*/router/*.yaml"))]
    for path in files:
        for name, value in _pairs(yaml.safe_load(path.read_text()) or {}):
            if name in ("password", "application_credential_secret") and isinstance(value, str):
                found.add(value)
    return {s for s in found if len(s) >= MIN_SECRET}


def _pairs(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key), item
            yield from _pairs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pairs(item)


def log_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_no_log_holds_a_secret_or_a_token(lab, fed):
    one, two, tiny = fed
    secrets = lab_secrets(lab)
    assert len(secrets) >= 4, "the lab's secrets were not found: the scan would prove nothing"
    # Tokens that cross the routers: a user of each cloud, scoped to the other cloud's image
    # service (token validation across clouds, token swaps, the CLI's pattern).
    marker = f"/v2/images?name=rt-{uuid.uuid4().hex[:8]}"
    tokens = []
    for here, there in ((one, two), (two, one)):
        conn = lab.connect(here.slug)
        tokens.append(conn.session.get_token())
        scope_session(conn.session, json.dumps({"image": there.name}), default_cloud=here.region)
        assert tiny[there.name] in {image.id for image in conn.image.images()}
        response = conn.session.get(
            f"http://{here.front_ip}:{here.port('image')}{marker}", raise_exc=False
        )
        assert response.status_code == 200
        tokens.append(conn.session.get_token())  # the scoped form the routers receive
    time.sleep(1.5)  # the routers write their logs in batches (at most half a second late)

    leaks: list[str] = []
    for path in log_files(lab.paths.logs):
        data = path.read_bytes()
        for value in (*secrets, *tokens):
            at = data.find(value.encode())
            if at >= 0:
                line = data.count(b"\n", 0, at) + 1
                kind = "token" if value in tokens else "secret"
                leaks.append(f"{path}:{line}: a {kind} of the lab")
        for match in FERNET.finditer(data):
            line = data.count(b"\n", 0, match.start()) + 1
            leaks.append(f"{path}:{line}: something shaped like a Fernet token")
    assert not leaks, "\n".join(sorted(set(leaks))[:40])

    # The routers logged those requests with a request id, and without the query string.
    entries = []
    query = marker.partition("?")[2]
    for cloud in (one, two):
        text = lab.paths.log(cloud, "router").read_text(errors="replace")
        assert query not in text
        for line in text.splitlines():
            if '"path": "/v2/images"' in line and line.startswith("{"):
                entries.append(json.loads(line))
    if entries:  # a lab running a router from before JSON logs has plain lines
        assert all(e.get("request_id", "").startswith("req-") for e in entries), entries
        assert not any("?" in e.get("path", "") for e in entries)  # no query strings
