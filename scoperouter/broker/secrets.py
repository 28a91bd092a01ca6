"""Secrets at rest: MultiFernet over the configured keys (newest first).

Every secret the broker keeps (a binding's credentials: the application credential secret) is
stored only as a Fernet token. Several keys let an operator rotate without downtime: put a new
key first (``SCOPEROUTER_BROKER_SECRET_KEYS=new,old`` or the keys file), restart or reload the
replicas (they decrypt with any key and encrypt with the first), run ``scoperouter broker
rotate-key`` to re-encrypt every stored secret with the new key, then drop the old key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet


class SecretsError(ValueError):
    """Bad keys, or a stored secret that no configured key can decrypt. The message never
    contains the secret or a key."""


def generate_key() -> str:
    """A fresh Fernet key (url-safe base64 text)."""
    return Fernet.generate_key().decode()


class Secrets:
    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise SecretsError("no secret keys configured")
        fernets = []
        for index, key in enumerate(keys):
            try:
                fernets.append(Fernet(key.encode() if isinstance(key, str) else key))
            except (ValueError, TypeError):
                raise SecretsError(
                    f"secret key #{index + 1} is not a Fernet key (32 url-safe base64 bytes)"
                ) from None
        self._fernet = MultiFernet(fernets)

    def encrypt(self, value: Mapping[str, Any]) -> str:
        return self._fernet.encrypt(json.dumps(value, separators=(",", ":")).encode()).decode()

    def decrypt(self, token: str) -> dict[str, Any]:
        try:
            data = json.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            raise SecretsError(
                "a stored secret cannot be decrypted with any configured key "
                "(was a key removed before `rotate-key` ran?)"
            ) from None
        if not isinstance(data, dict):
            raise SecretsError("a stored secret is not a JSON object")
        return data

    def rotate(self, token: str) -> str:
        """The same secret encrypted with the newest key."""
        try:
            return self._fernet.rotate(token.encode()).decode()
        except InvalidToken:
            raise SecretsError(
                "a stored secret cannot be decrypted with any configured key"
            ) from None
