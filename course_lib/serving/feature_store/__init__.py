"""The SQLite feature store: building the file, indexed and un-indexed lookups, a TTL cache in front.

* ``_build``: ``build_feature_store`` (the synthetic population written once, with its metadata);
* ``_lookup``: ``FeatureStore``, ``CachedFeatureStore``, ``make_lookup``.
"""

from __future__ import annotations

from course_lib.serving.feature_store._build import (
    DEFAULT_N_CUSTOMERS,
    DEFAULT_SEED,
    SCHEMA_VERSION,
    TABLE,
    FeatureStoreBuild,
    build_feature_store,
    customer_id,
    feature_store_path,
    read_meta,
)
from course_lib.serving.feature_store._lookup import (
    DEFAULT_CACHE_MAXSIZE,
    DEFAULT_CACHE_TTL_S,
    LOOKUP_MODES,
    CachedFeatureStore,
    FeatureStore,
    make_lookup,
)

__all__ = [
    "DEFAULT_CACHE_MAXSIZE",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_N_CUSTOMERS",
    "DEFAULT_SEED",
    "LOOKUP_MODES",
    "SCHEMA_VERSION",
    "TABLE",
    "CachedFeatureStore",
    "FeatureStore",
    "FeatureStoreBuild",
    "build_feature_store",
    "customer_id",
    "feature_store_path",
    "make_lookup",
    "read_meta",
]
