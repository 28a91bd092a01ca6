"""The merged marker of a list merged across clouds (``A & B``): each cloud's own position.

A merged page's next link carries one opaque marker (:func:`encode_marker`) holding each
cloud's state: from its start, after its own marker (the id of the last item of it the client
saw), or done. Each cloud checks its own marker as if the client had sent it, so the merged
one needs no signature; :func:`decode_marker` only checks its shape and size (bounded by the
clouds of the expression and :data:`MAX_CLOUD_MARKER`, :func:`max_marker_length`), and a
garbled one is a 400. Pure, no I/O; :mod:`scoperouter.merge` uses it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence

from scoperouter.errors import Reject

MARKER_PREFIX = "scope1."
MAX_CLOUD_MARKER = 255  # nova/glance/neutron/keystone markers are ids or names

START = ""  # a cloud's state: from its first item
DONE = None  # a cloud's state: every item seen
CloudState = str | None  # START, a marker of that cloud, or DONE


def encode_marker(states: Mapping[str, CloudState]) -> str:
    """The opaque marker a merged page's next link carries (URL-safe)."""
    payload = json.dumps({"v": 1, "c": dict(states)}, separators=(",", ":"))
    return MARKER_PREFIX + base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def max_marker_length(clouds: Sequence[str]) -> int:
    """The longest merged marker :func:`encode_marker` can make for `clouds` (every state a
    marker of MAX_CLOUD_MARKER characters, each escaped by JSON to at most 6): longer input is
    refused before it is decoded."""
    payload = 16 + sum(len(cloud) * 6 + 6 + MAX_CLOUD_MARKER * 6 for cloud in clouds)
    return len(MARKER_PREFIX) + (payload + 2) // 3 * 4


def decode_marker(text: str, clouds: Sequence[str]) -> dict[str, CloudState] | Reject:
    """The per-cloud states of a merged marker made for these `clouds`, or a 400."""
    longest = max_marker_length(clouds)
    if len(text) > longest:
        return _bad_marker(f"longer than {longest} characters")
    if not text.startswith(MARKER_PREFIX):
        return _bad_marker("it was not made by a merged list (it must come from a next link)")
    data = text[len(MARKER_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError):
        return _bad_marker("it is garbled")
    states = payload.get("c") if isinstance(payload, dict) and payload.get("v") == 1 else None
    if not isinstance(states, dict) or list(states) != list(clouds):
        return _bad_marker(f"it was made for other clouds than {' & '.join(clouds)}")
    for cloud, state in states.items():
        if state is not None and (not isinstance(state, str) or len(state) > MAX_CLOUD_MARKER):
            return _bad_marker(f"its state for {cloud} is not a marker")
    return states


def _bad_marker(why: str) -> Reject:
    return Reject(400, f"invalid marker for a list merged across clouds: {why}")
