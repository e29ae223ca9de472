"""Fixtures of the fault tests (defined in :mod:`fault_kit` and :mod:`sentinel_kit`)."""

from fault_kit import cert_dir, redis_server, serve
from sentinel_kit import sentinel_cluster

__all__ = ["cert_dir", "redis_server", "sentinel_cluster", "serve"]
