"""scoperouter: route OpenStack API requests between federated clouds by a per-request scope."""

__version__ = "0.1.0"
