"""``GET .../service_bindings/:binding_id``: a binding that exists (404 while it is being
created); the credentials only when it was made asynchronously (this GET is then how the
platform receives them; a synchronous bind answered them already)."""

from __future__ import annotations

from scoperouter.broker import models
from scoperouter.broker.logs import excerpt
from scoperouter.broker.osb.common import (
    Endpoints,
    OSBError,
    Reply,
)
from scoperouter.broker.tables import BOUND, UNBINDING


def get_binding(ep: Endpoints, instance_id: str, binding_id: str) -> Reply[models.BindingResponse]:
    with ep.store.read() as session:
        binding = ep.store.binding(session, binding_id)
    if (
        binding is None
        or binding.instance_id != instance_id
        or binding.state not in (BOUND, UNBINDING)
    ):
        raise OSBError(404, f"no binding {excerpt(binding_id)} (or it is still being created)")
    return Reply(200, ep.binding_body(binding, credentials=binding.asynchronous))
