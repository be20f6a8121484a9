"""The prediction cache: keys, in-process and Redis stores, the cached churn service, a local Redis server."""

__all__ = ["key", "redis_server", "service", "stores"]
