"""Broker services: plug-ins registered under the entry point group
``scoperouter.broker.services`` (see :mod:`scoperouter.broker.services.base`)."""
