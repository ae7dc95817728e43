"""The job indexes and the plpgsql functions of pg-boss schema versions 27 to 37.

Function bodies are alkstore_sa's own code, written from the documented behaviour of
the pg-boss functions of the same name and signature (Node pg-boss calls them).
Templates use ``@S@`` for the quoted schema and ``@L@`` for the schema as a string
literal (see :func:`alkstore_sa.migrations.helpers.execute_function`).

Each version's body is kept, so that a downgrade restores the one it replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .helpers import JobIndex, literal
from .versions.alkstore_0001_schema26 import CREATE_QUEUE as _CREATE_QUEUE_26

# ------------------------------------------------------------------ job indexes
# Declared once against `job`; built as <table>_iN on job_common and partitions.

_KEY = "COALESCE(singleton_key, '')"

I1 = JobIndex("i1", f"name, {_KEY}", "state = 'created' AND policy = 'short'", unique=True)
"""At most one queued job per key on ``short`` queues."""
I2 = JobIndex("i2", f"name, {_KEY}", "state = 'active' AND policy = 'singleton'", unique=True)
"""At most one active job per key on ``singleton`` queues."""
I3 = JobIndex("i3", f"name, state, {_KEY}", "state <= 'active' AND policy = 'stately'", unique=True)
"""At most one job per state (up to active) and key on ``stately`` queues."""
I4 = JobIndex(
    "i4",
    f"name, singleton_on, {_KEY}",
    "state <> 'cancelled' AND singleton_on IS NOT NULL",
    unique=True,
)
"""Throttling and debouncing: one job per key and time slot."""
I5_COVERING = JobIndex(
    "i5", "name, start_after", "state < 'active'", include="priority, created_on, id"
)
"""The fetch index of schema 26 (kept by schema 27 to 32 on tables that had it)."""
I5_COVERING_UNBLOCKED = JobIndex(
    "i5",
    "name, start_after",
    "state < 'active' AND NOT blocked",
    include="priority, created_on, id",
)
"""The fetch index ``create_queue`` gives new partitions at schema 31 and 32."""
I5_SLIM = JobIndex("i5", "name, start_after", "state < 'active' AND NOT blocked")
"""The fetch index from schema 33 on (no covering columns, flow children left out)."""
I6 = JobIndex("i6", f"name, {_KEY}", "state <= 'active' AND policy = 'exclusive'", unique=True)
"""At most one queued-or-active job per key on ``exclusive`` queues."""
I7 = JobIndex("i7", "name, group_id", "state = 'active' AND group_id IS NOT NULL")
"""Active jobs per group, for group concurrency (schema 27)."""
I8 = JobIndex(
    "i8",
    "name, singleton_key",
    "state IN ('active', 'retry', 'failed') AND policy = 'key_strict_fifo'",
    unique=True,
)
"""One active, retrying or failed job per key on ``key_strict_fifo`` queues (schema 28)."""
I9 = JobIndex("i9", "name, id", "blocking AND state = 'completed'")
"""Completed parents whose children still wait, for the flow resolver (schema 33)."""

KEY_STRICT_FIFO_CHECK = (
    "job_key_strict_fifo_singleton_key_check",
    "NOT (policy = 'key_strict_fifo' AND singleton_key IS NULL)",
)
"""Name and expression of the CHECK requiring a key on ``key_strict_fifo`` jobs."""

# ------------------------------------------------------------------ job_table_*

# pg-boss names indexes and tables `job`/`job_iN` in the commands it fans out; these
# functions point such a command at one physical table. Before schema 37 every
# ".job" and every "job_i" is rewritten; from 37 only the table reference `.job`
# (a whole word) and whole-word index names `job_i<digits>` are, so schema names
# containing "job_i" survive. Unlike pg-boss, a '%' in the command stays as written.
JOB_TABLE_FORMAT_27 = """
CREATE OR REPLACE FUNCTION @S@.job_table_format(command text, table_name text)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $body$
  SELECT format(
    replace(replace(replace(command, '%', '%%'), '.job', '.%1$I'), 'job_i', '%1$s_i'),
    table_name)
$body$
"""

JOB_TABLE_FORMAT_37 = r"""
CREATE OR REPLACE FUNCTION @S@.job_table_format(command text, table_name text)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $body$
  SELECT format(
    regexp_replace(
      regexp_replace(replace(command, '%', '%%'), '\.job\y', '.%1$I', 'g'),
      '\yjob_i([0-9]+)', '%1$s_i\1', 'g'),
    table_name)
$body$
"""

JOB_TABLE_RUN = """
CREATE OR REPLACE FUNCTION @S@.job_table_run(
  command text, tbl_name text DEFAULT NULL, queue_name text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $body$
DECLARE
  v_table text := tbl_name;
BEGIN
  -- A queue names its table; no queue and no table means every job table.
  IF queue_name IS NOT NULL THEN
    SELECT q.table_name INTO v_table FROM @S@.queue q WHERE q.name = queue_name;
  END IF;
  IF v_table IS NOT NULL THEN
    EXECUTE @S@.job_table_format(command, v_table);
    RETURN;
  END IF;
  EXECUTE @S@.job_table_format(command, 'job_common');
  FOR v_table IN SELECT q.table_name FROM @S@.queue q WHERE q.partition LOOP
    EXECUTE @S@.job_table_format(command, v_table);
  END LOOP;
END;
$body$
"""

JOB_TABLE_RUN_ASYNC = """
CREATE OR REPLACE FUNCTION @S@.job_table_run_async(
  command_name text, version integer, command text,
  tbl_name text DEFAULT NULL, queue_name text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $body$
DECLARE
  v_table text := tbl_name;
BEGIN
  -- Queues the command for pg-boss's background runner: one pending bam row per
  -- target table, the command already pointed at that table.
  IF queue_name IS NOT NULL THEN
    SELECT q.table_name INTO v_table FROM @S@.queue q WHERE q.name = queue_name;
  END IF;
  IF v_table IS NOT NULL THEN
    INSERT INTO @S@.bam (name, version, status, queue, table_name, command)
    VALUES (command_name, version, 'pending', queue_name, v_table,
            @S@.job_table_format(command, v_table));
    RETURN;
  END IF;
  INSERT INTO @S@.bam (name, version, status, queue, table_name, command)
  SELECT command_name, version, 'pending', t.queue, t.table_name,
         @S@.job_table_format(command, t.table_name)
    FROM (SELECT NULL::text AS queue, 'job_common'::text AS table_name, 0 AS pos
          UNION ALL
          SELECT q.name, q.table_name, 1 FROM @S@.queue q WHERE q.partition) t
   ORDER BY t.pos;
END;
$body$
"""

# ------------------------------------------------------------------ create_queue

# Columns of the queue row written by create_queue: (column, expression over
# queue_name, options and v_table). Schema 26's set, then the later additions.
QUEUE_COLUMNS_26: tuple[tuple[str, str], ...] = (
    ("name", "queue_name"),
    ("policy", "options->>'policy'"),
    ("retry_limit", "coalesce((options->>'retryLimit')::int, 2)"),
    ("retry_delay", "coalesce((options->>'retryDelay')::int, 0)"),
    ("retry_backoff", "coalesce((options->>'retryBackoff')::boolean, false)"),
    ("retry_delay_max", "(options->>'retryDelayMax')::int"),
    ("expire_seconds", "coalesce((options->>'expireInSeconds')::int, 900)"),
    ("retention_seconds", "coalesce((options->>'retentionSeconds')::int, 1209600)"),
    ("deletion_seconds", "coalesce((options->>'deleteAfterSeconds')::int, 604800)"),
    ("warning_queued", "coalesce((options->>'warningQueueSize')::int, 0)"),
    ("dead_letter", "options->>'deadLetter'"),
    ("partition", "coalesce((options->>'partition')::boolean, false)"),
    ("table_name", "v_table"),
)
HEARTBEAT_COLUMN = ("heartbeat_seconds", "(options->>'heartbeatSeconds')::int")
"""Queue column stored by create_queue from schema 30 on."""
NOTIFY_COLUMN = ("notify", "coalesce((options->>'notify')::boolean, false)")
"""Queue column stored by create_queue from schema 32 on."""

POLICY_INDEXES_27: Mapping[str, Sequence[JobIndex]] = {
    "short": (I1,),
    "singleton": (I2,),
    "stately": (I3,),
    "exclusive": (I6,),
}
POLICY_INDEXES_28: Mapping[str, Sequence[JobIndex]] = {
    **POLICY_INDEXES_27,
    "key_strict_fifo": (I8,),
}
POLICY_CHECKS_28: Mapping[str, Sequence[tuple[str, str]]] = {
    "key_strict_fifo": (KEY_STRICT_FIFO_CHECK,),
}


def create_queue_function(
    queue_columns: Sequence[tuple[str, str]],
    indexes: Sequence[JobIndex],
    policy_indexes: Mapping[str, Sequence[JobIndex]],
    policy_checks: Mapping[str, Sequence[tuple[str, str]]] | None = None,
) -> str:
    """Our ``create_queue(queue_name text, options jsonb)``, as a template.

    The queue row gets ``queue_columns``; an existing queue is left as it is. A queue
    created with ``"partition": true`` gets its own table, built like ``job`` (defaults
    included), with the primary key, the two queue foreign keys, ``indexes``, the
    indexes and CHECK constraints (``(name, expression)``) of its policy, and the
    ``cjc`` CHECK, then attached to ``job`` for its name.
    """
    columns = ",\n    ".join(c for c, _ in queue_columns)
    values = ",\n         ".join(e for _, e in queue_columns)
    build = "\n  ".join(i.plpgsql("v_schema", "v_table") for i in indexes)
    branches = []
    for policy, own in policy_indexes.items():
        stmts = [i.plpgsql("v_schema", "v_table") for i in own]
        for name, expression in (policy_checks or {}).get(policy, ()):
            template = f"ALTER TABLE %1$I.%2$I ADD CONSTRAINT %3$I CHECK ({expression})"
            stmts.append(
                f"EXECUTE format({literal(template)}, v_schema, v_table, {literal(name)});"
            )
        branches.append(f"    WHEN {literal(policy)} THEN\n      " + "\n      ".join(stmts))
    policy_case = (
        "CASE v_policy\n" + "\n".join(branches) + "\n    ELSE\n      NULL;\n  END CASE;"
        if branches
        else ""
    )
    return f"""
CREATE OR REPLACE FUNCTION @S@.create_queue(queue_name text, options jsonb)
RETURNS void
LANGUAGE plpgsql
AS $body$
DECLARE
  v_schema constant text := @L@;
  v_partitioned constant boolean := (options->>'partition') IS NOT DISTINCT FROM 'true';
  v_policy constant text := options->>'policy';
  v_table text := 'job_common';
  v_rows integer;
BEGIN
  IF v_partitioned THEN
    -- The same derivation as every pg-boss client: 'j' and the hex SHA-224 of the name.
    v_table := 'j' || encode(sha224(queue_name::bytea), 'hex');
  END IF;

  INSERT INTO @S@.queue AS q (
    {columns})
  SELECT {values}
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_rows = ROW_COUNT;

  -- An existing queue is left exactly as it is; shared queues need no partition.
  IF v_rows = 0 OR NOT v_partitioned THEN
    RETURN;
  END IF;

  EXECUTE format('CREATE TABLE %1$I.%2$I (LIKE %1$I.job INCLUDING DEFAULTS)', v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD PRIMARY KEY (name, id)', v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) '
                 'REFERENCES %1$I.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED',
                 v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) '
                 'REFERENCES %1$I.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED',
                 v_schema, v_table);
  {build}
  {policy_case}

  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT cjc CHECK (name = %3$L)',
                 v_schema, v_table, queue_name);
  EXECUTE format('ALTER TABLE %1$I.job ATTACH PARTITION %1$I.%2$I FOR VALUES IN (%3$L)',
                 v_schema, v_table, queue_name);
END;
$body$
"""


CREATE_QUEUE_26 = _CREATE_QUEUE_26.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
"""Schema 26's create_queue (the ``alkstore_0001`` revision's), for downgrades to 26."""

CREATE_QUEUE_27 = create_queue_function(QUEUE_COLUMNS_26, (I5_COVERING, I4, I7), POLICY_INDEXES_27)
"""Schema 27: partitions also get the group index i7."""

CREATE_QUEUE_28 = create_queue_function(
    QUEUE_COLUMNS_26, (I5_COVERING, I4, I7), POLICY_INDEXES_28, POLICY_CHECKS_28
)
"""Schema 28: ``key_strict_fifo`` partitions get i8 and the key CHECK."""

CREATE_QUEUE_30 = create_queue_function(
    (*QUEUE_COLUMNS_26, HEARTBEAT_COLUMN),
    (I5_COVERING, I4, I7),
    POLICY_INDEXES_28,
    POLICY_CHECKS_28,
)
"""Schema 30: the queue row stores ``heartbeatSeconds``."""

CREATE_QUEUE_31 = create_queue_function(
    (*QUEUE_COLUMNS_26, HEARTBEAT_COLUMN),
    (I5_COVERING_UNBLOCKED, I4, I7),
    POLICY_INDEXES_28,
    POLICY_CHECKS_28,
)
"""Schema 31: new partitions' fetch index leaves blocked flow children out."""

CREATE_QUEUE_32 = create_queue_function(
    (*QUEUE_COLUMNS_26, HEARTBEAT_COLUMN, NOTIFY_COLUMN),
    (I5_COVERING_UNBLOCKED, I4, I7),
    POLICY_INDEXES_28,
    POLICY_CHECKS_28,
)
"""Schema 32: the queue row stores ``notify``."""

CREATE_QUEUE_33 = create_queue_function(
    (*QUEUE_COLUMNS_26, HEARTBEAT_COLUMN, NOTIFY_COLUMN),
    (I5_SLIM, I4, I7, I9),
    POLICY_INDEXES_28,
    POLICY_CHECKS_28,
)
"""Schema 33 (current through 37): slim fetch index, flow resolver index i9."""
