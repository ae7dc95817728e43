"""Statement builders for pg-boss schema version 26 (pg-boss 11.1 and 12.0 to 12.5).

One module per path (send, fetch, settle, fail, supervision, queues, redrive,
inspect, metrics), each writing through the Declarative tables of
:mod:`alkstore_sa.models`. A later version's builders reuse what did not change.
"""
