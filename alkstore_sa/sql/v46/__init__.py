"""Statement builders for pg-boss schema version 46 (pg-boss 12.38.0).

One module per path (send, fetch, settle, fail, supervision, cron), each writing
through the schema-46 tables of :mod:`alkstore_sa.sql.v46.tables`. Operations choose
these or the schema-26 builders of :mod:`alkstore_sa.sql.v26` by ``ctx.version``.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import DateTime

from ..common.base import _SchemaFunction


class job_now(_SchemaFunction):
    """``<schema>.job_now()``: the clock every pg-boss 12.38 statement reads.

    It returns the transaction timestamp, like ``now()``, but a test clock in
    Node pg-boss can replace its body; reading time through it keeps our
    statements on the same clock as Node's in the same database.
    """

    fn_name = "job_now"
    inherit_cache = True
    type = DateTime(timezone=True)


def node_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which pg-boss 12 announces new jobs of ``schema``.

    ``pgboss_`` and the first 24 hex digits of SHA-224 of the schema name (the
    database name is not part of it); the payload is the queue name. Node sends
    and listens on it for queues created with ``notify``.
    """
    return "pgboss_" + hashlib.sha224(schema.encode("utf-8")).hexdigest()[:24]
