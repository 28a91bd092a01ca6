"""CatalogRegion: token validations answered by another cloud's keystone, made usable here.

Their catalog lists the other cloud's region only, and local services filter the catalog by
their own region; each endpoint gets a twin in this cloud's region with the same URL
(``identity.add_region``). Small JSON answers only; anything else passes untouched.
"""

from __future__ import annotations

import json

from mitmproxy import http

from scoperouter.identity import add_region
from scoperouter.proxy.flowstate import state_of
from scoperouter.routing import Forward


class CatalogRegion:
    def response(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        response = flow.response
        if state is None or response is None or not isinstance(state.decision, Forward):
            return
        region = state.decision.catalog_region
        if not region or response.stream:
            return
        content_type = response.headers.get("content-type", "")
        body = regioned(response.content or b"", region, response.status_code, content_type)
        if body is not None:
            response.content = body


def regioned(body: bytes, region: str, status: int, content_type: str) -> bytes | None:
    """The answer's body with the catalog's region twins, or None to leave it as it is (both
    data paths)."""
    if status != 200 or "json" not in content_type:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if isinstance(document, dict) and add_region(document, region):
        return json.dumps(document).encode()
    return None
