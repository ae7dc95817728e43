"""Statement builders for pg-boss schema version 46 (pg-boss 12.38.0).

One module per path (send, fetch, settle, fail, supervision, cron), each writing
through the schema-46 tables of :mod:`alkstore_sa.sql.v46.tables`. Operations choose
these or the schema-26 builders of :mod:`alkstore_sa.sql.v26` by ``ctx.version``.
"""

from __future__ import annotations

from sqlalchemy import DateTime

from ...names import node_channel as node_channel
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
