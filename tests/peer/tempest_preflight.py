"""Run by the runner before a tempest mode, in the mode's environment (its tempest.conf, its
sitecustomize hook): what tempest's own clients, made from that tempest.conf with its admin
credentials, reach. Prints one JSON line: the hook's state, the compute client's base URL and
the id of the image named argv[1] that tempest's image client lists. Nothing secret is printed.

Run as a file (``python tests/peer/tempest_preflight.py NAME``), as tempest's workers run:
without the repository's tests package.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> int:
    image_name = argv[1]
    found: dict[str, Any] = {}
    try:
        from tempest import clients
        from tempest.common import credentials_factory
        from tempest.lib import auth

        hooked = getattr(auth.KeystoneAuthProvider._decorate_request, "_scoperouter_peer", False)
        moved = getattr(auth.KeystoneV3AuthProvider.base_url, "_scoperouter_peer", False)
        found["hook"] = {"scope": hooked, "endpoints": moved}
        manager = clients.Manager(credentials_factory.get_configured_admin_credentials())
        found["compute"] = manager.servers_client.base_url
        images = manager.image_client_v2.list_images(params={"name": image_name})["images"]
        found["image"] = [i["id"] for i in images]
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"[:400]
    sys.stdout.write(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
