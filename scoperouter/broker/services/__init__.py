"""Broker services: plug-ins registered under the entry point group
``scoperouter.broker.services`` (the contract: :mod:`scoperouter.broker.contract`)."""
