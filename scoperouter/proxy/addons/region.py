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
        if not region or response.status_code != 200 or response.stream:
            return
        if "json" not in response.headers.get("content-type", ""):
            return
        try:
            body = json.loads(response.content or b"")
        except ValueError:
            return
        if isinstance(body, dict) and add_region(body, region):
            response.content = json.dumps(body).encode()
