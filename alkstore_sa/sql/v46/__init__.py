"""Statement builders for pg-boss schema version 46 (pg-boss 12.38.0).

One module per path (send, fetch, settle, fail, supervision, cron), each writing
through the schema-46 tables of :mod:`alkstore_sa.sql.tables46`. Operations choose
these or the schema-26 builders of :mod:`alkstore_sa.sql` by ``ctx.version``.
"""
