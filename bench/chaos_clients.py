"""``bench.chaos``'s client requests: what the OpenStack CLI sends, and what a success holds."""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from bench import chaos_verdict as cv
from bench.chaos_lab import LabView


@dataclass(frozen=True)
class Kind:
    """A CLI-like request: where it enters, its scope, and what a success must hold."""

    name: str
    entry: int  # index of the cloud whose router it enters at
    service: str  # image or compute
    path: str
    scope: str | None = None
    # for image lists: the acceptable sets of clouds whose `tiny` image the answer lists
    tiny_from: tuple[frozenset[int], ...] = ()


def kinds(tiny: dict[int, str], compute: bool) -> list[Kind]:
    one, two = frozenset({0}), frozenset({1})
    out = [
        Kind("image list at A", 0, "image", "/v2/images", None, (one,)),
        Kind("image list at B", 1, "image", "/v2/images", None, (two,)),
        Kind("image show at A", 0, "image", f"/v2/images/{tiny[0]}"),
        Kind("cross-cloud image list A->B", 0, "image", "/v2/images", '{"image": "CloudTwo"}',
             (two,)),
        Kind("cross-cloud image show B->A", 1, "image", f"/v2/images/{tiny[0]}",
             '{"image": "CloudOne"}'),
        Kind("A & B image list", 0, "image", "/v2/images", '{"image": "CloudOne & CloudTwo"}',
             (one | two,)),
        Kind("B | A image list at A", 0, "image", "/v2/images", '{"image": "CloudTwo | CloudOne"}',
             (two, one)),
    ]  # fmt: skip
    if compute:
        out += [
            Kind("server list at A", 0, "compute", "/servers"),
            Kind("server list at B", 1, "compute", "/servers"),
        ]
    return out


def wrong_images(kind: Kind, document: Any, tiny: dict[int, str]) -> str | None:
    """What is wrong with an image list's clouds (None: nothing)."""
    if not kind.tiny_from:
        return None
    listed = {image.get("id") for image in document.get("images", [])}
    got = frozenset(i for i, image_id in tiny.items() if image_id in listed)
    if got in kind.tiny_from:
        return None
    wanted = [sorted(s) for s in kind.tiny_from]
    return f"lists tiny of clouds {sorted(got)}, expected one of {wanted}"


class Run(Protocol):
    """What a client thread uses of the run (:class:`bench.chaos.Chaos`)."""

    args: argparse.Namespace
    lab: LabView
    kinds: list[Kind]
    tiny: dict[int, str]
    lock: threading.Lock
    record: cv.Record
    stop_clients: threading.Event

    def now(self) -> float: ...


class Client(threading.Thread):
    """One CLI user: a keystone session per (entry cloud, scope), a request at a time."""

    def __init__(self, chaos: Run, index: int) -> None:
        super().__init__(name=f"client-{index}", daemon=True)
        self.chaos = chaos
        self.rng = random.Random(chaos.args.seed * 100 + index)
        self.sessions: dict[tuple[int, str | None], Any] = {}

    def session(self, kind: Kind) -> Any:
        key = (kind.entry, kind.scope)
        if key not in self.sessions:
            from keystoneauth1 import session as ks_session
            from keystoneauth1.identity import v3

            from scoperouter.client import scope_session

            cloud = self.chaos.lab.clouds[kind.entry]
            auth = dict(self.chaos.lab.entries[cloud.slug]["auth"])
            sess = ks_session.Session(auth=v3.Password(**auth), timeout=self.chaos.args.deadline)
            if kind.scope is not None:
                scope_session(sess, kind.scope, default_cloud=cloud.region)
            self.sessions[key] = sess
        return self.sessions[key]

    def run(self) -> None:
        mix = self.chaos.kinds
        while not self.chaos.stop_clients.is_set():
            self.one(self.rng.choice(mix))
            self.chaos.stop_clients.wait(self.rng.uniform(0.1, 0.6))

    def one(self, kind: Kind) -> None:
        from keystoneauth1 import exceptions as ks

        deadline = self.chaos.args.deadline
        cloud = self.chaos.lab.clouds[kind.entry]
        url = cloud.endpoint_url(kind.service, True).rstrip("/") + kind.path
        start = time.monotonic()
        try:
            response = self.session(kind).get(url, raise_exc=False, timeout=deadline)
        except ks.HttpError as exc:  # keystone's answer to the token request, through the router
            response = exc.response
            if response is None:
                self._end(kind, cv.JSON_ERROR, str(exc), start)
                return
        except (ks.ConnectTimeout, ks.ConnectFailure) as exc:
            text = str(exc)
            if isinstance(exc, ks.ConnectTimeout) or "timed out" in text.lower():
                outcome = cv.HANG
            elif "refused" in text.lower():
                outcome = cv.REFUSED
            else:
                outcome = cv.DROPPED
            self._end(kind, outcome, text, start)
            return
        except ks.ClientException as exc:  # anything else keystoneauth raises: not clean
            self._end(kind, cv.NON_JSON, f"{type(exc).__name__}: {exc}", start)
            return
        elapsed = time.monotonic() - start
        ctype = response.headers.get("Content-Type", "")
        outcome = cv.classify_answer(
            response.status_code, ctype, response.content, elapsed, deadline
        )
        detail = f"{response.status_code} {ctype}: {response.content[:200]!r}"
        if outcome == cv.OK:
            problem = wrong_images(kind, response.json(), self.chaos.tiny)
            if problem is not None:
                outcome, detail = cv.WRONG, problem
        self._end(kind, outcome, detail, start, response.status_code)

    def _end(self, kind: Kind, outcome: str, detail: str, start: float, status: int = 0) -> None:
        took = time.monotonic() - start
        if took > self.chaos.args.deadline and outcome != cv.HANG:
            outcome, detail = cv.HANG, f"took {took:.1f} s: {detail}"
        with self.chaos.lock:
            self.chaos.record.slowest = max(self.chaos.record.slowest, took)
            self.chaos.record.request(
                kind.name, outcome, f"t={self.chaos.now():.0f}s {detail}", status
            )
