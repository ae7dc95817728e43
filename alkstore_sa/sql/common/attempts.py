"""Reading and tidying the attempt history (:mod:`alkstore_sa.models.attempts`).

The same at every schema version: the table is ours, and a job is found by its queue
and id in ``job`` at 26 and 46 alike. The writes are in the fail statements
(:func:`alkstore_sa.sql.common.failing.record_attempts`).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    Text,
    TextClause,
    Uuid,
    bindparam,
    delete,
    exists,
    func,
    text,
)
from sqlalchemy import select as select_

from ...models.attempts import ATTEMPT
from .base import JOB
from .reading import readable_columns


@functools.cache
def job_attempts() -> Select[Any]:
    """The recorded attempts of job ``:id`` of queue ``:qname``, oldest first, each row
    readable whatever it holds (:func:`~.reading.readable_columns`)."""
    a = ATTEMPT
    return (
        select_(*readable_columns(a.c, a))
        .where(
            a.c.name == bindparam("qname", type_=Text), a.c.job_id == bindparam("id", type_=Uuid)
        )
        .order_by(a.c.id)
    )


@functools.cache
def sweep_orphans() -> Select[Any]:
    """Delete, among the ``:limit`` attempts after id ``:after``, those whose job no
    longer exists (deleted by supervision, ours or Node's, by id or with its queue).

    Answers one row: ``last`` (the highest id looked at; NULL when none was left after
    ``:after``, so the next sweep starts again from the beginning) and ``deleted``.
    A job failed again meanwhile is deleted and inserted in one transaction, so its
    attempts never look orphaned.
    """
    a = ATTEMPT
    window = (
        select_(a.c.id, a.c.name, a.c.job_id)
        .where(a.c.id > bindparam("after", type_=BigInteger))
        .order_by(a.c.id)
        .limit(bindparam("limit", type_=Integer))
        .cte("window")
    )
    alive = exists().where(JOB.c.name == window.c.name, JOB.c.id == window.c.job_id)
    gone = delete(a).where(a.c.id == window.c.id, ~alive).returning(a.c.id).cte("gone")
    return select_(
        select_(func.max(window.c.id)).scalar_subquery().label("last"),
        select_(func.count()).select_from(gone).scalar_subquery().label("deleted"),
    )


@functools.cache
def bound_lock_wait() -> TextClause:
    """Set ``lock_timeout`` to ``:ms`` milliseconds, or keep it when it is already
    shorter (and not 0), for the transaction (``:local``) or else the session; answers
    the setting it replaced as ``old``, for :func:`restore_lock_wait`. Run before a fail
    that records attempts, so a lock another session holds on the attempt history
    bounds how long the fail waits (the "Attempt history" page)."""
    return text(
        "SELECT s.setting AS old, set_config('lock_timeout', CASE WHEN CAST(s.setting "
        "AS bigint) BETWEEN 1 AND :ms THEN s.setting ELSE CAST(:ms AS text) END, :local) "
        "AS new FROM (SELECT setting FROM pg_settings WHERE name = 'lock_timeout' "
        "OFFSET 0) AS s"
    ).bindparams(bindparam("ms", type_=Integer), bindparam("local", type_=Boolean))


@functools.cache
def restore_lock_wait() -> TextClause:
    """Put back the ``lock_timeout`` :func:`bound_lock_wait` replaced (``:old``)."""
    return text("SELECT set_config('lock_timeout', :old, :local)").bindparams(
        bindparam("old", type_=Text), bindparam("local", type_=Boolean)
    )


@functools.cache
def current_role() -> TextClause:
    """The role the session's statements run as (``current_user``)."""
    return text("SELECT current_user")


@functools.cache
def history_usable() -> TextClause:
    """Whether the attempt history ``:t`` (the table's qualified, quoted name) can take a
    fail's attempts now, without waiting: ``present`` (the table is there), ``writable``
    (the role may insert, read and delete its rows) and ``locked`` (another session
    holds, or waits for, a lock that would make the fail wait). Read before a fail that
    runs on its own (autocommit), where no ``lock_timeout`` can bound one statement."""
    return text(
        "SELECT r.oid IS NOT NULL AS present, "
        "COALESCE(has_table_privilege(r.oid, 'INSERT') AND has_table_privilege(r.oid, "
        "'SELECT') AND has_table_privilege(r.oid, 'DELETE'), false) AS writable, "
        "EXISTS (SELECT 1 FROM pg_locks l WHERE l.relation = r.oid AND l.mode IN "
        "('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')) "
        "AS locked FROM (SELECT to_regclass(:t) AS oid) AS r"
    ).bindparams(bindparam("t", type_=Text))
