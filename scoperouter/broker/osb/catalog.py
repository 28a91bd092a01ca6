"""``GET /v2/catalog``: the offerings of the enabled services, rendered once (config only: no
cloud is asked, so the broker answers while a cloud is down)."""

from __future__ import annotations

from scoperouter.broker import models
from scoperouter.broker.runtime import Broker


def catalog(broker: Broker) -> models.Catalog:
    return models.Catalog(
        services=[models.service_model(entry) for entry in broker.offerings.values()]
    )
