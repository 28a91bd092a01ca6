"""Errors the router answers with, and the config error the loader raises.

OpenStack clients (keystoneauth, openstacksdk, the `openstack` CLI) understand error bodies of the
form ``{"error": {"code": 400, "title": "Bad Request", "message": "..."}}`` (keystone's format;
keystoneauth's ``from_response`` reads ``error.message``), so every error the router produces,
whatever the service being routed, uses that shape. Messages are one line, name the cloud and the
service when one is known, and never contain a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus


def status_title(status: int) -> str:
    """The standard reason phrase (508 -> "Loop Detected")."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_body(status: int, message: str, title: str | None = None) -> bytes:
    """An OpenStack-style JSON error body."""
    payload = {
        "error": {"code": status, "title": title or status_title(status), "message": message}
    }
    return json.dumps(payload).encode()


@dataclass(frozen=True, slots=True)
class Reject:
    """A routing decision that answers the client itself; nothing reaches a backend."""

    status: int
    message: str

    @property
    def title(self) -> str:
        return status_title(self.status)

    def body(self) -> bytes:
        return error_body(self.status, self.message)


class ClientGone(Exception):
    """The client closed its connection before its request was answered (logged as 499,
    nginx's "client closed request": nothing is sent to anyone)."""


class ConfigError(Exception):
    """A federation config that cannot be used; `location` says where (file:key.path)."""

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message
