"""Building blocks of the revisions after pg-boss schema 26 (``alkstore_0027`` onward).

Each revision after 26 does what pg-boss's own migration to that schema version does,
in two steps, like the ``pg-boss migrate`` command line:

1. inside the migration transaction, under pg-boss's migration advisory lock
   (:func:`begin_upgrade`): the table and function DDL, then :func:`set_version`;
2. after that transaction commits: the index builds pg-boss leaves to its background
   runner (the ``bam`` table), done here at once with ``CREATE INDEX CONCURRENTLY`` on
   ``job_common`` and on every partition table (:func:`create_index`,
   :func:`drop_index`), so no ``bam`` row is left for a Node instance to run.

Re-running a revision whose step 1 committed but whose step 2 was interrupted (the
pg-boss version already reads N) skips step 1 and finishes step 2, dropping and
rebuilding any INVALID index a cancelled build left behind.

Every identifier written into SQL goes through the dialect's identifier preparer;
values go in as SQL literals (the offline script has no bind parameters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from .._pooler import refuse_pooled
from ..errors import SchemaVersionError
from ..names import DEFAULT_SCHEMA, schema_key
from ..schema_versions import NO_VERSION_ROW
from ..sql.common.base import version_row

log = logging.getLogger(__name__)

JOB_COMMON = "job_common"
"""The shared (DEFAULT) partition of ``job``; queues without ``partition`` live there."""


class UnexpectedVersionError(SchemaVersionError):
    """A revision found the pg-boss schema at a version it cannot start from.

    Raised before the revision changes anything.
    """

    def __init__(self, schema: str, found: int | None, revision_version: int, *, upgrade: bool):
        self.schema = schema
        self.found = found
        self.expected = revision_version - 1 if upgrade else revision_version
        step = (
            f"upgrading to pg-boss schema version {revision_version} needs version "
            f"{revision_version - 1} (or {revision_version}, to finish an interrupted upgrade)"
            if upgrade
            else f"downgrading pg-boss schema version {revision_version} needs that version"
        )
        shown = "no version row" if found in (None, NO_VERSION_ROW) else f"version {found}"
        # Bypass SchemaVersionError's advice, which is about schema 26 only.
        Exception.__init__(
            self,
            f"schema {schema!r} is at {shown}; {step}. Nothing was changed. Compare "
            "`alkstore db current` with the schema's version row: another program "
            "(Node pg-boss's start() or `pg-boss migrate`) may have migrated it",
        )


# --------------------------------------------------------------------------- quoting


def quote_schema(schema: str) -> str:
    """``schema`` quoted as an identifier by the dialect (only when it needs quotes)."""
    return op.get_context().dialect.identifier_preparer.quote_schema(schema)


def quote_ident(name: str) -> str:
    """A table or index name quoted as an identifier by the dialect."""
    return op.get_context().dialect.identifier_preparer.quote(name)


def literal(value: str) -> str:
    """``value`` as a standard SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def qualified(schema: str, name: str) -> str:
    """``schema.name``, each part quoted as needed."""
    return f"{quote_schema(schema)}.{quote_ident(name)}"


def is_offline() -> bool:
    """Whether the revision is being rendered as an SQL script (``--sql``)."""
    return bool(op.get_context().as_sql)


# --------------------------------------------------------------------------- locking


def lock_key_sql(schema: str) -> str:
    """The bigint advisory key pg-boss takes while it installs or migrates ``schema``.

    pg-boss derives it from the database name and the schema (empty key suffix); using
    the very same key means a Node ``start()`` and one of our revisions never migrate
    the same schema at once.
    """
    # The runtime's own expression, rendered as text (revisions also render as an
    # offline script): one derivation of the key for both.
    from ..sql.common.base import advisory_key

    key = advisory_key(sa.literal(schema_key(schema), sa.Text))
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return str(key.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def migration_lock(schema: str) -> None:
    """Take pg-boss's migration lock for the rest of the current transaction."""
    run_sql(f"SELECT pg_advisory_xact_lock({lock_key_sql(schema)})")


# --------------------------------------------------------------------------- version row


def installed_version(schema: str) -> int:
    """The pg-boss version row of ``schema`` (whose version table a revision has
    locked), :data:`~alkstore_sa.schema_versions.NO_VERSION_ROW` without a row, as
    every reader of the row answers. Online only."""
    bind = op.get_bind().execution_options(schema_translate_map={DEFAULT_SCHEMA: schema})
    found = bind.execute(version_row()).scalar()
    return NO_VERSION_ROW if found is None else int(found)


def begin_upgrade(schema: str, version: int) -> bool:
    """Lock, then say whether the transactional part of ``version``'s upgrade must run.

    ``True`` when the schema is at ``version - 1`` (and always when rendering SQL);
    ``False`` when it already reads ``version``: an earlier run committed the DDL but
    not the index builds, which the caller then finishes. Any other version raises
    :class:`UnexpectedVersionError`.
    """
    migration_lock(schema)
    if is_offline():
        return True
    found = installed_version(schema)
    if found == version - 1:
        return True
    if found == version:
        log.info(
            "schema %s already reads version %s: finishing its index builds",
            schema,
            version,
            extra={"action": "upgrade_resume", "schema": schema, "version": version},
        )
        return False
    raise UnexpectedVersionError(schema, found, version, upgrade=True)


def begin_downgrade(schema: str, version: int) -> None:
    """Lock, and refuse unless the schema is at ``version``."""
    migration_lock(schema)
    if is_offline():
        return
    found = installed_version(schema)
    if found != version:
        raise UnexpectedVersionError(schema, found, version, upgrade=False)


def set_version(schema: str, version: int) -> None:
    """Write ``version`` into the pg-boss version row."""
    version_table = sa.table("version", sa.column("version", sa.Integer()), schema=schema)
    op.execute(version_table.update().values(version=sa.literal_column(str(int(version)))))


# --------------------------------------------------------------------------- job tables


def job_tables(conn: sa.Connection, schema: str, policy: str | None = None) -> list[str]:
    """``job_common`` and every partition table of a queue with ``partition = true``.

    With ``policy``, only the partitions of queues with that policy (``job_common``
    still comes first: it holds every policy's shared jobs). Queue rows whose table is
    missing are skipped.
    """
    queue = f"{quote_schema(schema)}.queue"
    sql = (
        f"SELECT q.table_name FROM {queue} q WHERE q.partition AND q.table_name <> "
        f"{literal(JOB_COMMON)} AND to_regclass(quote_ident({literal(schema)}) || '.' || "
        "quote_ident(q.table_name)) IS NOT NULL"
    )
    if policy is not None:
        sql += f" AND q.policy = {literal(policy)}"
    sql += " ORDER BY q.table_name"
    found = [str(t) for t in conn.execute(sa.text(sql)).scalars()]
    return [JOB_COMMON, *dict.fromkeys(found)]


def _job_tables_select(schema: str, policy: str | None) -> str:
    # The same list as job_tables(), as a query for plpgsql to loop over.
    sql = (
        f"SELECT {literal(JOB_COMMON)} UNION SELECT q.table_name FROM "
        f"{quote_schema(schema)}.queue q WHERE q.partition AND to_regclass("
        f"quote_ident({literal(schema)}) || '.' || quote_ident(q.table_name)) IS NOT NULL"
    )
    if policy is not None:
        sql += f" AND q.policy = {literal(policy)}"
    return sql


# --------------------------------------------------------------------------- indexes


@dataclass(frozen=True)
class JobIndex:
    """An index pg-boss declares once against ``job`` and builds on each job table.

    On a table ``T`` it is named ``T_<suffix>`` (``job_common_i7``, ``j<hash>_i7``).
    ``columns``, ``include`` and ``where`` are SQL text in terms of the job columns.
    """

    suffix: str
    columns: str
    where: str | None = None
    unique: bool = False
    include: str | None = None

    def name(self, table: str) -> str:
        """The index name on ``table``."""
        return f"{table}_{self.suffix}"

    def _tail(self) -> str:
        tail = f" ({self.columns})"
        if self.include:
            tail += f" INCLUDE ({self.include})"
        if self.where:
            tail += f" WHERE {self.where}"
        return tail

    def _head(self, *, concurrently: bool, if_not_exists: bool) -> str:
        return (
            "CREATE "
            + ("UNIQUE " if self.unique else "")
            + "INDEX "
            + ("CONCURRENTLY " if concurrently else "")
            + ("IF NOT EXISTS " if if_not_exists else "")
        )

    def ddl(
        self, schema: str, table: str, *, concurrently: bool = False, if_not_exists: bool = True
    ) -> str:
        """The ``CREATE INDEX`` statement for ``table``, identifiers quoted."""
        return (
            self._head(concurrently=concurrently, if_not_exists=if_not_exists)
            + f"{quote_ident(self.name(table))} ON {qualified(schema, table)}"
            + self._tail()
        )

    def plpgsql(self, schema_var: str, table_var: str, *, if_not_exists: bool = False) -> str:
        """An ``EXECUTE format(...)`` statement building it inside plpgsql.

        ``schema_var`` and ``table_var`` are plpgsql expressions giving the schema and
        the table name; both are quoted by ``format('%I')`` at run time.
        """
        template = (
            self._head(concurrently=False, if_not_exists=if_not_exists)
            + "%3$I ON %1$I.%2$I"
            + self._tail()
        ).replace("%", "%%")
        # Undo the escaping of our own three placeholders.
        template = (
            template.replace("%%3$I", "%3$I").replace("%%1$I", "%1$I").replace("%%2$I", "%2$I")
        )
        return (
            f"EXECUTE format({literal(template)}, {schema_var}, {table_var}, "
            f"{table_var} || {literal('_' + self.suffix)});"
        )


def _index_state(conn: sa.Connection, schema: str, name: str) -> bool | None:
    """``None`` if the index does not exist, else whether it is valid."""
    return conn.execute(
        sa.text(
            "SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = "
            "to_regclass(quote_ident(:s) || '.' || quote_ident(:n))"
        ),
        {"s": schema, "n": name},
    ).scalar()


def _index_definition(conn: sa.Connection, schema: str, name: str) -> str | None:
    found = conn.execute(
        sa.text(
            "SELECT pg_get_indexdef(x.indexrelid) FROM pg_index x WHERE x.indexrelid = "
            "to_regclass(quote_ident(:s) || '.' || quote_ident(:n)) AND x.indisvalid"
        ),
        {"s": schema, "n": name},
    ).scalar()
    return None if found is None else str(found)


def _external_transaction() -> bool:
    # A caller-owned transaction (a connection handed over already inside one)
    # cannot be committed by the revision, so CONCURRENTLY is impossible there.
    ctx = op.get_context()
    return bool(getattr(ctx, "_in_external_transaction", False))


@contextmanager
def _outside_transaction(schema: str) -> Iterator[sa.Connection]:
    """Commit the migration transaction and yield an autocommit connection.

    The builds run under a session-level hold on pg-boss's migration lock, so a Node
    ``start()`` arriving meanwhile waits instead of migrating the schema under them.
    """
    with op.get_context().autocommit_block():
        conn = op.get_bind()
        refuse_pooled(conn, schema)
        conn.execute(sa.text(f"SELECT pg_advisory_lock({lock_key_sql(schema)})"))
        try:
            yield conn
        finally:
            conn.execute(sa.text(f"SELECT pg_advisory_unlock({lock_key_sql(schema)})"))


def _in_transaction_loop(schema: str, policy: str | None, statements: Sequence[str]) -> None:
    # Offline scripts and caller-owned transactions: the same builds, without
    # CONCURRENTLY, fanned out by the database itself at run time.
    body = " ".join(statements)
    run_sql(
        "DO $alkstore$ DECLARE t text; BEGIN FOR t IN "
        + _job_tables_select(schema, policy)
        + " LOOP "
        + body
        + " END LOOP; END $alkstore$"
    )


def create_index(
    schema: str,
    index: JobIndex,
    *,
    policy: str | None = None,
    tables: Sequence[str] | None = None,
) -> None:
    """Build ``index`` on ``job_common`` and every partition, ``CONCURRENTLY``, after commit.

    ``policy`` limits the partitions to queues of that policy; ``tables`` names the
    tables outright (e.g. ``["job_common"]``). ``IF NOT EXISTS`` keeps a re-run cheap;
    an INVALID leftover of an interrupted build is dropped concurrently and rebuilt.
    Offline, or inside a transaction the caller owns, the same indexes are built
    inside the transaction instead (same catalog, but writes wait for the build).
    """
    create_indexes(schema, [index], policy=policy, tables=tables)


def create_indexes(
    schema: str,
    indexes: Sequence[JobIndex],
    *,
    policy: str | None = None,
    tables: Sequence[str] | None = None,
) -> None:
    """:func:`create_index` for several indexes, each over all its tables in turn."""
    if is_offline() or _external_transaction():
        if tables is not None:
            for index in indexes:
                for table in tables:
                    run_sql(index.ddl(schema, table))
            return
        _in_transaction_loop(
            schema,
            policy,
            [
                _drop_if_invalid_plpgsql(schema, index)
                + index.plpgsql(literal(schema), "t", if_not_exists=True)
                for index in indexes
            ],
        )
        return
    with _outside_transaction(schema) as conn:
        targets = list(tables) if tables is not None else job_tables(conn, schema, policy)
        for index in indexes:
            for table in targets:
                _build(conn, schema, index, table)


def _drop_if_invalid_plpgsql(schema: str, index: JobIndex) -> str:
    # An INVALID leftover would satisfy IF NOT EXISTS; drop it so it is rebuilt.
    name = f"format('%I.%I', {literal(schema)}, t || {literal('_' + index.suffix)})"
    return (
        "IF EXISTS (SELECT 1 FROM pg_index x WHERE x.indexrelid = "
        f"to_regclass({name}) AND NOT x.indisvalid) THEN "
        f"EXECUTE 'DROP INDEX ' || {name}; END IF; "
    )


def _build(conn: sa.Connection, schema: str, index: JobIndex, table: str) -> None:
    name = index.name(table)
    if _index_state(conn, schema, name) is False:
        log.warning(
            "index %s.%s is INVALID (an interrupted build): rebuilding it",
            schema,
            name,
            extra={"action": "rebuild_invalid_index", "schema": schema, "index": name},
        )
        conn.execute(sa.text(f"DROP INDEX CONCURRENTLY IF EXISTS {qualified(schema, name)}"))
    conn.execute(sa.text(index.ddl(schema, table, concurrently=True)))
    if _index_state(conn, schema, name) is not True:
        raise RuntimeError(f"index {schema}.{name} is not valid after its build")


def drop_index(
    schema: str,
    suffix: str,
    *,
    policy: str | None = None,
    tables: Sequence[str] | None = None,
    concurrently: bool = True,
    keep_if: Callable[[str], bool] | None = None,
) -> None:
    """Drop ``<table>_<suffix>`` from ``job_common`` and every partition, if present.

    With ``concurrently`` (the default) this runs after commit like :func:`create_index`;
    without it, inside the migration transaction (what downgrades do, as pg-boss's
    rollbacks do). ``keep_if`` (concurrent path only) is given an existing index's
    ``pg_get_indexdef`` text and keeps the index when it answers true, so a resumed
    reshape does not rebuild what the interrupted run already built.
    """
    if concurrently and not is_offline() and not _external_transaction():
        with _outside_transaction(schema) as conn:
            targets = list(tables) if tables is not None else job_tables(conn, schema, policy)
            for table in targets:
                name = f"{table}_{suffix}"
                if keep_if is not None:
                    definition = _index_definition(conn, schema, name)
                    if definition is not None and keep_if(definition):
                        continue
                conn.execute(
                    sa.text(f"DROP INDEX CONCURRENTLY IF EXISTS {qualified(schema, name)}")
                )
        return
    if tables is not None:
        for table in tables:
            run_sql(f"DROP INDEX IF EXISTS {qualified(schema, f'{table}_{suffix}')}")
        return
    _in_transaction_loop(
        schema,
        policy,
        [
            f"EXECUTE format('DROP INDEX IF EXISTS %I.%I', {literal(schema)}, "
            f"t || {literal('_' + suffix)});"
        ],
    )


def run_on_job_tables(schema: str, template: str, *, policy: str | None = None) -> None:
    """Run ``template`` on every job table, inside the migration transaction.

    ``template`` is a ``format()`` string: ``%1$I`` is the schema, ``%2$I`` the table.
    """
    _in_transaction_loop(
        schema, policy, [f"EXECUTE format({literal(template)}, {literal(schema)}, t);"]
    )


def create_index_in_transaction(schema: str, index: JobIndex, *, policy: str | None = None) -> None:
    """Build ``index`` on every job table inside the migration transaction (downgrades)."""
    _in_transaction_loop(schema, policy, [index.plpgsql(literal(schema), "t", if_not_exists=True)])


def settle_bam(schema: str, version: int) -> None:
    """Mark ``version``'s unfinished ``bam`` rows completed, once its indexes are built.

    A Node instance runs the rows that are not completed; after our builds there is
    nothing left for it to do (rows exist only if a Node migration enqueued them).
    """
    bam = f"{quote_schema(schema)}.bam"
    run_sql(
        f"UPDATE {bam} SET status = 'completed', error = NULL, "
        "started_on = COALESCE(started_on, now()), completed_on = now() "
        f"WHERE version = {int(version)} AND status <> 'completed'"
    )


def execute_function(template: str, schema: str) -> None:
    """Run a function definition written with ``@S@`` (the quoted schema) and ``@L@``
    (the schema as a string literal)."""
    run_sql(template.replace("@S@", quote_schema(schema)).replace("@L@", literal(schema)))


def run_sql(sql: str) -> None:
    """Run one SQL text: online through the connection, offline written to the script as is.

    Offline, Alembic compiles a ``text()`` with the environment's dialect, and psycopg's
    default paramstyle (``format``) doubles every ``%``: a function body's
    ``format('%1$I', ...)`` would reach the script as ``'%%1$I'`` and install a broken
    function. Written out directly, the script holds the SQL as it runs online, whatever
    paramstyle the user's ``env.py`` configures.
    """
    context = op.get_context()
    if context.as_sql:
        context.impl.static_output(sql.strip() + context.impl.command_terminator)
    else:
        op.execute(sa.text(sql))


def forget_unfinished_builds(schema: str, version: int) -> None:
    """Delete ``version``'s ``bam`` rows that did not complete, as pg-boss's rollback does,
    so that no background runner rebuilds an index the downgrade is about to drop."""
    run_sql(
        f"DELETE FROM {quote_schema(schema)}.bam "
        f"WHERE version = {int(version)} AND status <> 'completed'"
    )
