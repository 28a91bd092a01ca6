"""The Open Service Broker (OSB 2.17) front-end of the federation (docs/broker.md).

Platforms (Cloud Foundry, Kubernetes, OpenShift) provision OpenStack resources through it; it
decides which cloud each one goes to and reaches every cloud through its router with scoped
requests (:mod:`scoperouter.client`), exactly as the CLI does.
"""
