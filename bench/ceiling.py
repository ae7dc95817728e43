"""The raw-SQL ceiling: plain psycopg 3 running the statements alkstore_sa builds.

The SQL below is written by hand as plain strings, on purpose: it is what a
careful engineer would send with psycopg directly, with the same shape as the
statements of ``alkstore_sa/sql`` (same CTEs, joins, predicates, literals and
bound arrays), so the database does the same work and only the Python layers
differ. ``bench.shapes`` checks that both produce the same query plans.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

INPUT_COLUMNS = (
    ("id", "uuid"),
    ("priority", "integer"),
    ("data", "jsonb"),
    ("start_at", "timestamptz"),
    ("start_in", "interval"),
    ("singleton_key", "text"),
    ("singleton_seconds", "integer"),
    ("singleton_offset", "integer"),
    ("expire_seconds", "integer"),
    ("deletion_seconds", "integer"),
    ("retention_seconds", "integer"),
    ("retry_limit", "integer"),
    ("retry_delay", "integer"),
    ("retry_backoff", "boolean"),
    ("retry_delay_max", "integer"),
    ("dead_letter", "text"),
)

_SRC_COLUMNS = ", ".join(n for n, _ in INPUT_COLUMNS)

INSERT_SQL = (
    """
WITH ins AS (
  INSERT INTO {s}.job (id, name, priority, data, retry_limit, retry_delay, retry_backoff,
                       retry_delay_max, expire_seconds, deletion_seconds, singleton_key,
                       singleton_on, start_after, keep_until, dead_letter, policy)
  SELECT src.id, q.name, coalesce(src.priority, 0), src.data,
         coalesce(src.retry_limit, q.retry_limit),
         coalesce(src.retry_delay, q.retry_delay),
         coalesce(src.retry_backoff, q.retry_backoff, false),
         coalesce(src.retry_delay_max, q.retry_delay_max),
         coalesce(src.expire_seconds, q.expire_seconds),
         coalesce(src.deletion_seconds, q.deletion_seconds),
         src.singleton_key,
         CASE WHEN src.singleton_seconds IS NOT NULL THEN 'epoch'::timestamp
              + src.singleton_seconds * floor((extract(epoch FROM now())
              + coalesce(src.singleton_offset, 0)) / CAST(src.singleton_seconds AS numeric))
              * interval '1 second' END,
         coalesce(src.start_at, now() + coalesce(src.start_in, interval '0')),
         coalesce(src.start_at, now() + coalesce(src.start_in, interval '0'))
              + coalesce(src.retention_seconds, q.retention_seconds) * interval '1 second',
         coalesce(src.dead_letter, q.dead_letter),
         q.policy
  FROM unnest({unnest}) AS src("""
    + _SRC_COLUMNS
    + """)
  JOIN {s}.queue AS q ON true
  WHERE q.name = %(qname)s
  ON CONFLICT DO NOTHING
  RETURNING id, start_after
)
SELECT hdr.found, hdr.policy, counted.inserted, counted.ids,
       (SELECT pg_notify(%(channel)s, %(qname)s)
         WHERE EXISTS (SELECT ins.id FROM ins WHERE ins.start_after <= now())) AS notified
FROM (SELECT EXISTS (SELECT name FROM {s}.queue WHERE name = %(qname)s) AS found,
             (SELECT policy FROM {s}.queue WHERE name = %(qname)s) AS policy) AS hdr
JOIN (SELECT count(*) AS inserted,
             CASE WHEN count(*) < %(n_jobs)s THEN array_agg(ins.id) END AS ids
      FROM ins) AS counted ON true
"""
)

JOB_COLUMNS = (
    "id, name, priority, data, state, retry_limit, retry_count, retry_delay, retry_backoff, "
    "retry_delay_max, expire_seconds, deletion_seconds, singleton_key, singleton_on, "
    "start_after, created_on, started_on, completed_on, keep_until, output, dead_letter, policy"
)

_NAMES = [c.strip() for c in JOB_COLUMNS.split(",")]
COL_DATA = _NAMES.index("data")
COL_STARTED_ON = _NAMES.index("started_on")

_READY = """name = %(qname)s AND state < 'active'
    AND EXISTS (SELECT name FROM {s}.queue
                WHERE name = %(qname)s AND policy = %(cached_policy)s)
    AND start_after < now()"""
_CLAIMABLE = (
    _READY
    + """
    AND (policy IS NULL OR policy NOT IN ('singleton', 'stately'))"""
)
_HEAD = "%(limit)s::integer * 2 + 100"  # sql.common.claim.HEAD_ROOM, HEAD_EXTRA

FETCH_SQL = (
    """
WITH head AS (
  SELECT id FROM {s}.job WHERE """
    + _READY
    + """
  ORDER BY priority DESC, created_on, id
  LIMIT """
    + _HEAD
    + """
), fast AS (
  SELECT id FROM {s}.job WHERE """
    + _CLAIMABLE
    + """
    AND id IN (SELECT head.id FROM head)
  ORDER BY priority DESC, created_on, id
  LIMIT %(limit)s::integer
  FOR UPDATE SKIP LOCKED
), slow AS (
  SELECT id FROM {s}.job WHERE """
    + _CLAIMABLE
    + """
    AND (SELECT count(*) FROM fast) < %(limit)s::integer
    AND (SELECT count(*) FROM head) >= """
    + _HEAD
    + """
  ORDER BY priority DESC, created_on, id
  LIMIT %(limit)s::integer
  FOR UPDATE SKIP LOCKED
), next AS (
  SELECT id FROM fast
  WHERE NOT ((SELECT count(*) FROM fast) < %(limit)s::integer
             AND (SELECT count(*) FROM head) >= """
    + _HEAD
    + """)
  UNION ALL SELECT id FROM slow
), claimed AS (
  UPDATE {s}.job AS j SET state = 'active',
         retry_count = CASE WHEN j.started_on IS NOT NULL THEN j.retry_count + 1
                            ELSE j.retry_count END,
         started_on = now()
  FROM next WHERE j.name = %(qname)s AND j.id = next.id
  RETURNING """
    + ", ".join(f"j.{c}" for c in _NAMES)
    + """
)
SELECT """
    + JOB_COLUMNS
    + """ FROM claimed ORDER BY priority DESC, created_on, id
"""
)

COMPLETE_SQL = """
UPDATE {s}.job AS j SET state = 'completed', completed_on = now(),
       output = CAST(src.output AS jsonb)
FROM unnest(%(ids)s::uuid[], %(outputs)s::text[], %(fences)s::timestamptz[])
     AS src(id, output, fence)
WHERE j.name = %(qname)s AND j.id = src.id AND j.state = 'active'
  AND (src.fence IS NULL OR j.started_on = src.fence)
RETURNING j.id
"""


def unnest_arguments(given: frozenset[str]) -> str:
    """The arrays of the insert: bound for the ``given`` inputs, NULL for the others.

    alkstore_sa leaves out the inputs no job of a batch uses; so does the ceiling.
    """
    return ", ".join(
        (_ARRAYS.get(n) or f"%(in_{n})s::{t}[]") if n in given else f"NULL::{t}[]"
        for n, t in INPUT_COLUMNS
    )


DATA_ARRAY = (
    "(SELECT array_agg(nullif(d.e, 'null'::jsonb) ORDER BY d.i)"
    " FROM jsonb_array_elements(%(in_data)s::jsonb) WITH ORDINALITY AS d(e, i))"
)
"""The jobs' data: one JSON array text bound, made a ``jsonb[]`` once per statement."""

ID_ARRAY = "%(in_id)s::text::uuid[]"
"""The jobs' ids: one text bound, an array literal of hex ids."""

_ARRAYS = {"data": DATA_ARRAY, "id": ID_ARRAY}


GIVEN = frozenset({"id", "data"})
"""The inputs of the benchmark's jobs (data and nothing else)."""


class Statements:
    """The ceiling's statements with the schema filled in (composed once)."""

    def __init__(self, schema: str) -> None:
        ident = sql.Identifier(schema)
        insert = INSERT_SQL.replace("{unnest}", unnest_arguments(GIVEN))
        self.insert = sql.SQL(insert).format(s=ident)
        # Large batches, as alkstore_sa sends them into a standard queue: without ON
        # CONFLICT, in a savepoint (one round trip in pipeline mode).
        self.insert_plain = sql.SQL(insert.replace("  ON CONFLICT DO NOTHING\n", "")).format(
            s=ident
        )
        self.fetch = sql.SQL(FETCH_SQL).format(s=ident)
        self.complete = sql.SQL(COMPLETE_SQL).format(s=ident)
        self.channel = f"alkstore_{schema}"


def id_literal(n: int) -> str:
    """``n`` random version-4 UUIDs, ascending, as one array literal of hex ids: one
    ``os.urandom`` call, the version and variant bits set on the whole buffer."""
    clear = int.from_bytes(bytes.fromhex("ffffffffffff0fff3fffffffffffffff") * n, "big")
    marks = int.from_bytes(bytes.fromhex("00000000000040008000000000000000") * n, "big")
    raw = ((int.from_bytes(os.urandom(16 * n), "big") & clear) | marks).to_bytes(16 * n, "big")
    chunks = sorted([raw[i : i + 16] for i in range(0, 16 * n, 16)])
    return "{" + b"".join(chunks).hex(",", 16) + "}"


def insert_params(st: Statements, queue: str, datas: Sequence[Any]) -> dict[str, Any]:
    """Parameters of :data:`INSERT_SQL` for jobs with data only: ids (ascending,
    as alkstore_sa sends them, so a batch stays first-in first-out) and JSON text."""
    return {
        "in_id": id_literal(len(datas)),
        "in_data": json.dumps(list(datas), separators=(",", ":"), ensure_ascii=False),
        "qname": queue,
        "channel": st.channel,
        "n_jobs": len(datas),
    }


PLAIN_JOBS = 200
"""From this many jobs on, the insert goes without ON CONFLICT in a savepoint (as ours)."""


def send(conn: psycopg.Connection[Any], st: Statements, queue: str, datas: Sequence[Any]) -> int:
    """Insert the jobs (no commit); return how many were inserted."""
    params = insert_params(st, queue, datas)
    if len(datas) < PLAIN_JOBS:
        row = conn.execute(st.insert, params).fetchone()
    else:
        with conn.pipeline():
            conn.execute("SAVEPOINT ceiling")
            cur = conn.execute(st.insert_plain, params)
            conn.execute("RELEASE SAVEPOINT ceiling")
        row = cur.fetchone()
    return int(row[2]) if row else 0


async def asend(
    conn: psycopg.AsyncConnection[Any], st: Statements, queue: str, datas: Sequence[Any]
) -> int:
    params = insert_params(st, queue, datas)
    if len(datas) < PLAIN_JOBS:
        cur = await conn.execute(st.insert, params)
    else:
        async with conn.pipeline():
            await conn.execute("SAVEPOINT ceiling")
            cur = await conn.execute(st.insert_plain, params)
            await conn.execute("RELEASE SAVEPOINT ceiling")
    row = await cur.fetchone()
    return int(row[2]) if row else 0


def fetch_params(queue: str, limit: int) -> dict[str, Any]:
    # The queue's policy, as alkstore_sa's client-side cache would know it.
    return {"qname": queue, "limit": limit, "cached_policy": "standard"}


def fetch(conn: psycopg.Connection[Any], st: Statements, queue: str, limit: int) -> list[Any]:
    return conn.execute(st.fetch, fetch_params(queue, limit)).fetchall()


async def afetch(
    conn: psycopg.AsyncConnection[Any], st: Statements, queue: str, limit: int
) -> list[Any]:
    cur = await conn.execute(st.fetch, fetch_params(queue, limit))
    return await cur.fetchall()


def complete_params(
    queue: str, jobs: Sequence[tuple[uuid.UUID, datetime | None]]
) -> dict[str, Any]:
    return {
        "qname": queue,
        "ids": [j[0] for j in jobs],
        "outputs": [None] * len(jobs),
        "fences": [j[1] for j in jobs],
    }


def complete(
    conn: psycopg.Connection[Any],
    st: Statements,
    queue: str,
    jobs: Sequence[tuple[uuid.UUID, datetime | None]],
) -> int:
    return len(conn.execute(st.complete, complete_params(queue, jobs)).fetchall())


async def acomplete(
    conn: psycopg.AsyncConnection[Any],
    st: Statements,
    queue: str,
    jobs: Sequence[tuple[uuid.UUID, datetime | None]],
) -> int:
    cur = await conn.execute(st.complete, complete_params(queue, jobs))
    return len(await cur.fetchall())
