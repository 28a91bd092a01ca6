"""scoperouter: route OpenStack API requests between federated clouds by a per-request scope."""

from scoperouter._build import build, build_line, choose

__version__ = "0.1.0"
__all__ = ["__version__", "build", "build_line"]

# Compiled or pure, for the whole process, before any module of the hot path is imported
# (scoperouter._build: SCOPEROUTER_PURE=1, a stale or missing compiled build -> pure).
choose()
