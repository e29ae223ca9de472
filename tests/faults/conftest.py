"""Fixtures of the fault tests (defined in :mod:`fault_kit`)."""

from fault_kit import cert_dir, redis_server, serve

__all__ = ["cert_dir", "redis_server", "serve"]
