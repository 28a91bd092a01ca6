"""The service contract, under the name plug-ins import it by.

The contract itself lives in :mod:`scoperouter.broker.contract`, below the services (so that
the broker's own helpers, :mod:`~scoperouter.broker.credentials` and
:mod:`~scoperouter.broker.placement`, use it without importing the plug-in package). This module
keeps ``scoperouter.broker.services.base`` working for third-party services, which subclass
:class:`Service` from here (docs/broker.md, "The service contract").
"""

from __future__ import annotations

from scoperouter.broker.contract import (
    CATALOG_NAMESPACE as CATALOG_NAMESPACE,
)
from scoperouter.broker.contract import (
    DRAFT4 as DRAFT4,
)
from scoperouter.broker.contract import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
)
from scoperouter.broker.contract import (
    BindingView as BindingView,
)
from scoperouter.broker.contract import (
    Capacity as Capacity,
)
from scoperouter.broker.contract import (
    CatalogEntry as CatalogEntry,
)
from scoperouter.broker.contract import (
    Clouds as Clouds,
)
from scoperouter.broker.contract import (
    Done as Done,
)
from scoperouter.broker.contract import (
    Failed as Failed,
)
from scoperouter.broker.contract import (
    Found as Found,
)
from scoperouter.broker.contract import (
    InstanceLookup as InstanceLookup,
)
from scoperouter.broker.contract import (
    InstanceView as InstanceView,
)
from scoperouter.broker.contract import (
    InvalidParameters as InvalidParameters,
)
from scoperouter.broker.contract import (
    JSONSchema as JSONSchema,
)
from scoperouter.broker.contract import (
    LeaseLost as LeaseLost,
)
from scoperouter.broker.contract import (
    OperationContext as OperationContext,
)
from scoperouter.broker.contract import (
    OperationKind as OperationKind,
)
from scoperouter.broker.contract import (
    Outcome as Outcome,
)
from scoperouter.broker.contract import (
    Pending as Pending,
)
from scoperouter.broker.contract import (
    PlanEntry as PlanEntry,
)
from scoperouter.broker.contract import (
    Schemas as Schemas,
)
from scoperouter.broker.contract import (
    Service as Service,
)
from scoperouter.broker.contract import (
    stable_id as stable_id,
)
