"""Prediction cache: keys, in-process and Redis stores, the cached service, a local Redis, hit/miss costs."""

__all__ = ["costs", "key", "redis_server", "service", "stores"]
