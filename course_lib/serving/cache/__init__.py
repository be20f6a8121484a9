"""The prediction cache: keys, in-process and Redis stores, the cached churn service, a local Redis server,
and what a hit and a miss cost against no cache."""

__all__ = ["costs", "key", "redis_server", "service", "stores"]
