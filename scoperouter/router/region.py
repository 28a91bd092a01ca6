"""Catalog regions: token validations answered by another cloud's keystone, made usable here.

Their catalog lists the other cloud's region only, and local services filter the catalog by
their own region; each endpoint gets a twin in this cloud's region with the same URL
(``identity.add_region``). Small JSON answers only; anything else passes untouched.
"""

from __future__ import annotations

import json

from scoperouter.identity import add_region

REGION_MAX = 1024 * 1024  # a token validation's body is rewritten up to this size


def regioned(body: bytes, region: str, status: int, content_type: str) -> bytes | None:
    """The answer's body with the catalog's region twins, or None to leave it as it is."""
    if status != 200 or "json" not in content_type:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if isinstance(document, dict) and add_region(document, region):
        return json.dumps(document).encode()
    return None
