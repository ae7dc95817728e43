"""Benchmarks of alkstore_sa against a raw-SQL ceiling (plain psycopg, same statements).

Run everything with ``python -m bench`` (``--quick`` for a short pass); see
``bench/README.md`` for the scenarios, the ceiling and the latest results.
"""
