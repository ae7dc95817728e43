"""What needs which pg-boss schema version: one table, read by every check.

The runtime speaks several schema versions (:data:`alkstore_sa.names.SPOKEN_SCHEMA_VERSIONS`).
What differs between them is in two places only: the statement set of each
version (:mod:`alkstore_sa.sql.statements`) and this table of the operations,
fetch options, queue policies, settings and behaviours that a version brought.
Operations never compare version numbers; they ask :func:`has` or
:func:`require` by feature name. The options of ``send`` and of queues carry
their own first version in the option table (``OptionSpec.since`` in
:mod:`alkstore_sa.options`), checked the same way.

A schema at a later version has every feature of an earlier one: pg-boss has
not removed one yet, and when it does the entry will say until when.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .errors import SchemaFeatureError

FEATURES: Mapping[str, int] = MappingProxyType(
    {
        # Operations of the services.
        "flow": 46,
        "touch": 46,
        "update": 46,
        "upsert": 46,
        "get_blocked_keys": 46,
        "an rrule schedule": 46,
        "a group filter": 46,
        "redrive filters": 46,
        "queue-stats history": 46,
        "completion counts": 46,
        "the warning table": 46,
        "the instance registry": 46,
        # Fetch options and queue policies.
        "group_concurrency": 46,
        "key_strict_fifo": 46,
        # Supervisor settings.
        "persist_queue_stats": 46,
        "queue_stats_retention_days": 46,
        # Behaviours the runtime follows where the schema has them.
        "dead letters record their source queue": 46,
        "retained and total counts": 46,
        "Node's notify channel": 46,
        "ready, blocked and failed counts": 46,
        "deletion_seconds 0 (keep forever)": 46,
        "a trace context on jobs": 46,
        # Database backend profiles other than plain PostgreSQL (pg-boss 12.27 on).
        "a backend profile's flags": 46,
    }
)
"""Each feature, by name, and the first pg-boss schema version that has it.

The names are what :class:`~alkstore_sa.SchemaFeatureError` and the option errors
print; the "Compatibility with pg-boss, and deliberate differences" page lists them
by version."""


def since(feature: str) -> int:
    """The first schema version that has ``feature`` (a key of :data:`FEATURES`)."""
    return FEATURES[feature]


def has(version: int, feature: str) -> bool:
    """Whether a schema at ``version`` has ``feature``."""
    return version >= FEATURES[feature]


def require(schema: str, version: int, feature: str, what: str | None = None) -> None:
    """Refuse ``feature`` on ``schema`` at ``version`` if the version lacks it: a
    :class:`~alkstore_sa.SchemaFeatureError` naming ``what`` (default: the feature),
    raised before any statement."""
    needed = FEATURES[feature]
    if version < needed:
        raise SchemaFeatureError(schema, what or feature, needed, version)


__all__ = [
    "FEATURES",
    "has",
    "require",
    "since",
]
