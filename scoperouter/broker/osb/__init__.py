"""The OSB 2.17 endpoints, one module each, apart from the HTTP transport (``api.py``).

Each module holds the spec's rules for one endpoint and returns a typed :class:`~.common.Reply`
(a status and a pydantic response model of ``models.py``, or the polling route's TypedDict);
``api.py`` turns replies and :class:`~.common.OSBError` into HTTP. The split follows
openbrokerapi (``api.py`` apart from ``service_broker.py``) and cloud-service-broker (one file
per endpoint):

- ``catalog.py``          GET  /v2/catalog
- ``provision.py``        PUT  /v2/service_instances/:id
- ``update.py``           PATCH /v2/service_instances/:id
- ``deprovision.py``      DELETE /v2/service_instances/:id
- ``instance.py``         GET  /v2/service_instances/:id
- ``last_operation.py``   GET  .../last_operation (of an instance or a binding)
- ``bind.py``             PUT  .../service_bindings/:binding_id
- ``unbind.py``           DELETE .../service_bindings/:binding_id
- ``binding.py``          GET  .../service_bindings/:binding_id

``common.py`` holds what several endpoints share: the error type, the request facts, the
:class:`~.common.Endpoints` object (the broker, its store and runner, the operation factory,
the guarded claims) and the inline run of synchronous binds.

Every mutating endpoint decides from what is in the database and either answers from it (an
identical repeat: the same operation; a conflict: 409; a busy instance: 422) without writing
anything, or writes its rows and commits *before* answering. Any 4xx is raised inside the
transaction, which rolls it back: the database is exactly as it was.
"""
