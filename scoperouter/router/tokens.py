"""TokenSwap: carries a local service's token to another cloud (see scoperouter/identity.py).

When the decision marks headers in ``Forward.swap_tokens`` (keystonemiddleware validating a
token another cloud issued, ``X-Service-Token`` of nova calling another cloud's glance), the
token is checked with this cloud's keystone (valid, with a service role) and replaced by the
router's own token for the target cloud. Keystone's answers are cached: a swap waits for
keystone only on the rare path that needs one.
"""

from __future__ import annotations

import logging

from scoperouter.catalog import Catalog
from scoperouter.errors import Reject
from scoperouter.identity import Identity
from scoperouter.router.config import RouterConfig
from scoperouter.router.state import RequestState
from scoperouter.routing import Forward
from scoperouter.scope import split_token

logger = logging.getLogger("scoperouter")


class TokenSwap:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.identity: Identity | None = None
        config.subscribe(self._configure)

    def _configure(self, catalog: Catalog) -> None:
        if self.identity is None:
            self.identity = Identity(catalog, self.config.cloud)
        else:
            self.identity.update(catalog)

    async def swap(self, state: RequestState, decision: Forward) -> dict[str, str] | Reject:
        """The header edits that carry the request's tokens to the decision's cloud (none
        when it asks for no swap), or the refusal."""
        identity = self.identity
        if not decision.swap_tokens or identity is None:
            return {}
        received = state.headers
        tokens = {
            name: split_token(received[name])[0]
            for name in decision.swap_tokens
            if name in received
        }
        try:
            return await identity.swap(tokens, decision.swap_tokens, decision.cloud)
        except Exception:
            logger.exception("token swap failed for %s %s", state.method, state.path)
            return Reject(500, "the router failed to carry the request's tokens (see its log)")
