"""Limits on what a job may carry, checked before any SQL is sent.

Each limit keeps a row readable and claimable by every worker: a value past one of them
is refused with :class:`~alkstore_sa.errors.InvalidOptionsError` when it is sent, and a
row written past one by another client is failed on its own when it is claimed (see
the "Guarantees" page). The limits and the reasons for them are listed in
the "Limits" page.
"""

from __future__ import annotations

import datetime as dt

#: Deepest nesting of arrays and objects accepted in job data and output. Python's JSON
#: decoder recurses once per level; 256 leaves a worker thread ample stack under the
#: default recursion limit of 1,000 frames.
MAX_JSON_DEPTH = 256

#: Largest ``singleton_key``, in bytes of UTF-8. The key enters the unique indexes of the
#: job table together with the queue name (up to 200 bytes), the state and the
#: throttle slot, and a btree entry may not exceed 2,704 bytes on 8 kB pages; past it
#: PostgreSQL raises an error at insert or, worse, when the job is activated, which
#: stops every fetch of the queue. With the longest queue name the widest index holds
#: keys of about 2,470 incompressible bytes; 2,048 leaves room for alignment and
#: for servers that store index entries slightly differently.
MAX_SINGLETON_KEY_BYTES = 2048

#: Largest schedule ``key``, in bytes of UTF-8. Firing a schedule sends a job whose
#: ``singleton_key`` is ``"<queue>__<key>"`` (as pg-boss does), so the key leaves room
#: for the longest queue name and the two underscores.
MAX_SCHEDULE_KEY_BYTES = MAX_SINGLETON_KEY_BYTES - 202

#: Largest ``group_id`` (schema 46), in bytes of UTF-8. The group enters the index of
#: active jobs per group (``job_i7``, with the queue name) when its job is claimed, under
#: the same btree limit as :data:`MAX_SINGLETON_KEY_BYTES`.
MAX_GROUP_ID_BYTES = MAX_SINGLETON_KEY_BYTES

#: Largest ``group_tier`` (schema 46), in bytes of UTF-8, and largest tier name in a
#: ``group_concurrency`` mapping. No index holds it; it is kept to the group's limit so
#: the two read alike.
MAX_GROUP_TIER_BYTES = MAX_SINGLETON_KEY_BYTES

#: Largest published event name, in bytes of UTF-8. It is part of the primary key of
#: the subscription table, with the queue name, under the same btree limit as
#: :data:`MAX_SINGLETON_KEY_BYTES`.
MAX_EVENT_BYTES = MAX_SINGLETON_KEY_BYTES

#: Largest encoded job ``data`` (and job ``output``), in bytes of compact UTF-8 JSON.
#: PostgreSQL would store up to about 255 MB in a jsonb value, but every fetch, retry
#: and inspection reads the whole row: a queue row should carry references to large
#: content, not the content. 1 MiB matches the default message limit of Kafka and of
#: Amazon SQS. It is read when each job is sent, so an application that needs more may
#: raise it at start-up.
MAX_PAYLOAD_BYTES = 1024 * 1024

#: Earliest absolute ``start_after``. PostgreSQL stores much earlier times, but they
#: must also come back as Python datetimes (from year 1) in the reader's session time
#: zone, which may be up to a day west of UTC.
EARLIEST_START = dt.datetime(1, 1, 2, tzinfo=dt.UTC)

#: Latest absolute ``start_after`` (exclusive). The job's ``keep_until`` is
#: ``start_after`` plus up to 68 years of retention, and must stay below Python's year
#: 10,000 in every session time zone.
LATEST_START = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)

#: Longest relative ``start_after``: about a thousand years from the database clock,
#: which keeps the result before :data:`LATEST_START`.
LONGEST_WAIT = dt.timedelta(days=365_000)

#: Most jobs one :meth:`~alkstore_sa.QueueService.flow` may create. A flow is one
#: statement in the caller's transaction: every job and dependency is bound as one
#: set of arrays and every row stays locked until the transaction ends. A flow of
#: 10,000 children under one parent takes well under a second; past 100,000 jobs a
#: flow should be split into several, chained by a job that sends the next part.
MAX_FLOW_JOBS = 100_000

#: Most dependencies (parent-child pairs) in one flow, for the same reason as
#: :data:`MAX_FLOW_JOBS`: a dense graph has far more edges than jobs.
MAX_FLOW_DEPENDENCIES = 1_000_000

#: Most steps one evaluation of a schedule's RFC 5545 recurrence rule may take: periods
#: the evaluator walks (one day of a daily rule, one month of a monthly one) plus the
#: occurrences it reads. Evaluation walks from the rule's start: a ``COUNT`` far from its
#: ``DTSTART`` (unless the rule has no ``BY...`` part, whose occurrences are counted
#: without walking), or parts that few or no dates satisfy, can take millions of steps.
#: Past the limit the rule is refused by ``schedule()``, and a stored row is reported as
#: an invalid schedule and skipped when the timekeeper fires. The rules schedules are
#: made of take a few thousand steps.
MAX_RRULE_STEPS = 200_000

#: Longest one evaluation of a recurrence rule may run, in seconds of the evaluating
#: thread's CPU time, with the same outcome as :data:`MAX_RRULE_STEPS` past it. The step
#: limit is what bounds a rule in practice (about a fifth of a second on a current
#: machine); this one bounds steps that cost more than usual on a slow machine. CPU time,
#: not wall time: on a loaded machine (a busy CI runner, coverage on) a wall-clock second
#: refused rules that take 30 ms when the machine is idle.
MAX_RRULE_SECONDS = 2.0

#: Longest delay before a retry, in seconds: 100 years of 365.25 days. pg-boss's backoff
#: at schema 46 multiplies ``retry_delay`` (up to 2^31 - 1 seconds) by up to 2^17,
#: about 2.8e14 seconds, past PostgreSQL's interval range (about 9.2e12 seconds), which
#: made the whole fail or expiry statement raise. The cap keeps ``start_after`` a time
#: every client reads (well before :data:`LATEST_START`); pg-boss's value is kept
#: whenever it is shorter, which at schema 26 (``retry_delay`` plus at most 2^17
#: seconds, 68 years) is always.
LONGEST_RETRY_DELAY = 3_155_760_000

#: Failed attempts kept per job in the attempt history (``alkstore_job_attempt``, the
#: "Attempt history" page): the newest ones, written by the statement that fails each
#: attempt, which also removes the older ones. A job that fails without end (a retry
#: limit in the thousands, or a client failing it again and again by id) keeps a
#: bounded record.
ATTEMPTS_KEPT = 25

#: Largest error an attempt of the attempt history keeps as written, in bytes of JSON text.
#: An output over it (a job's output may be up to :data:`MAX_PAYLOAD_BYTES`) is kept as its
#: ``name``, the first quarter of this of its ``message`` and of its ``stack``, and its size
#: (``truncated``); the job row itself keeps the whole last output, as pg-boss does.
MAX_ATTEMPT_ERROR_BYTES = 64 * 1024

#: Largest ``message`` and largest ``stack`` a worker keeps of a handler's error, each in
#: bytes of UTF-8: a quarter of :data:`MAX_ATTEMPT_ERROR_BYTES`, as the attempt history
#: keeps them. An error past it (a message of megabytes, a traceback chaining several
#: large errors) is stored with the start of each and its full size as ``truncated``, so
#: its output stays far below :data:`MAX_PAYLOAD_BYTES` and the job is failed with its
#: own error rather than with an error about the output's size.
MAX_ERROR_TEXT_BYTES = MAX_ATTEMPT_ERROR_BYTES // 4

#: Longest a fail that records its attempt waits for a lock on the attempt history
#: (``lock_timeout``, in milliseconds): past it the fail is written without the attempt
#: (the "Attempt history" page), so a session holding a lock on the table (a ``LOCK
#: TABLE``, a long ``ALTER``) never stalls a worker's settlements or supervision's expiry.
ATTEMPT_LOCK_WAIT_MS = 1000
