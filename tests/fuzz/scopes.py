"""The ``scope`` family: list reads whose token carries fuzzed ``&``/``|`` scope expressions.

Each input is one ``GET /v2/images?fs=<n>`` at CloudOne's image frontend with
``X-Auth-Token: t!SCOPE!{"image": "<expression>"}``: clouds named many times over, many parts,
mixed case, unknown clouds, nesting, long expressions (up to and past the length limit), odd
spacing and operators. The recording backends answer these reads with an image list of a few
tens of kilobytes (:func:`answer`), so that an amplification shows in the workers' memory.

What must hold: the backend requests one client request costs (counted at both backends by
the ``fs=<n>`` of their target) are at most the distinct clouds it names; every answer is JSON
with a sane status (200, or a 4xx/502/503/504 OpenStack error; never a 500 or no answer);
the workers' RSS comes back to where it was once the family is over.
"""

from __future__ import annotations

import json
import random
import re

from tests.integration.backends import Received

CLOUDS = ["CloudOne", "CloudTwo"]
_OTHER = ["CloudThree", "Nowhere", "cloud-1", "A", "x" * 60, "0", "CloudOne.", "Cloud_One"]
IMAGES = 600  # per answer: ~60 kB of JSON
_FS = re.compile(rb"[?&]fs=(\d+)")


def _name(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.7:
        name = rng.choice(CLOUDS)
    elif roll < 0.85:
        name = rng.choice(_OTHER)
    else:
        name = rng.choice(CLOUDS)
        name = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)
    return name


def _expression(rng: random.Random, depth: int) -> str:
    shape = rng.random()
    if depth > 3 or shape < 0.25:
        return _name(rng)
    parts = rng.choice([2, 2, 3, 5, 10, 30, 90, 200])
    op = rng.choice([" & ", " | ", "&", "|", " &  ", " & "])
    if shape < 0.8:  # one operator, often the same cloud again and again
        same = _name(rng) if rng.random() < 0.5 else None
        return op.join(same or _name(rng) for _ in range(parts))
    inner = [_expression(rng, depth + 1) for _ in range(min(parts, 6))]
    return op.join(f"({x})" if rng.random() < 0.7 else x for x in inner)


def expression(seed: int, n: int) -> str:
    rng = random.Random(seed * 9_000_011 + n)
    text = _expression(rng, 0)
    if rng.random() < 0.05:
        text = "(" * rng.choice([5, 16, 17, 40]) + "CloudOne" + ")" * rng.choice([5, 16, 17, 40])
    if rng.random() < 0.05:
        text = rng.choice(["CloudOne &", "& CloudTwo", "CloudOne && CloudTwo", "()", "", "|"])
    return text


def request(seed: int, n: int, front: bytes) -> tuple[bytes, str]:
    """Input `n`'s bytes, and its expression."""
    text = expression(seed, n)
    token = b"t!SCOPE!" + json.dumps({"image": text}, separators=(",", ":")).encode()
    data = (
        b"GET /v2/images?fs=%d HTTP/1.1\r\nHost: %s\r\nX-Auth-Token: %s\r\n"
        b"X-Scope-Request-Id: fs%d\r\nConnection: close\r\n\r\n" % (n, front, token, n)
    )
    return data, text


def input_of(received: Received) -> int | None:
    """The scope input a backend request was made for, or None."""
    found = _FS.search(received.target)
    return int(found.group(1)) if found else None


def answer(name: str) -> bytes:
    body = json.dumps(
        {
            "images": [
                {"id": f"{name}-{i:06d}", "name": f"image {i} of {name}", "status": "active"}
                for i in range(IMAGES)
            ]
        }
    ).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def early(name: str):  # type: ignore[no-untyped-def]
    """A RecordingBackend's `early`: the image list for the family's reads, nothing else."""
    body = answer(name)

    def reply(received: Received) -> bytes | None:
        return body if input_of(received) is not None and received.method == "GET" else None

    return reply


SANE = {200, 400, 403, 404, 409, 413, 414, 431, 502, 503, 504}
