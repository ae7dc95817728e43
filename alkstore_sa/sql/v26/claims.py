"""Our workers' claims at schema 26 (:mod:`alkstore_sa.models.claims`).

pg-boss 11.1.x has no heartbeats: a job whose worker died stays ``active`` until its
lease (``expire_seconds``) runs out, and that lease is also Node's handler timeout, so
it cannot be shortened. Instead a worker's claim records each job it activates in
``alkstore_claim`` (``job_id``, ``name``, the attempt's ``started_on``, the worker's
``owner`` id), in the claim statement itself: one row and one primary-key entry per
job. Each worker renews its own ``alkstore_claimer`` row (one row per worker, one
statement per interval, whatever it runs). A sweep fails for retry, through the normal
fail statement, the jobs still active *in the recorded attempt* (same ``started_on``)
whose claimer's row lapsed, and removes the rows of attempts that ended.

Node's claims write nothing here, so a Node worker's job is never swept; a job we
claimed that Node runs again has a new ``started_on``, so its old row matches nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CTE,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from ...models.claims import CLAIM, CLAIMER
from ...models.enums import JobState
from ..common.base import JOB, any_name, seconds, state_text

FORGET_BATCH = 5000
"""Rows of ended attempts one sweep removes at most."""

CLAIMER_KEPT_SECONDS = 86400
"""A claimer's row is removed this long after it lapsed (its claims were rescued)."""


def owner() -> Any:
    """``:claim_owner``, the worker whose claims and liveness a statement writes."""
    return bindparam("claim_owner", type_=Uuid())


def lapse() -> Any:
    """``:claim_lapse``: seconds after its last renewal that a claimer counts as gone."""
    return bindparam("claim_lapse", type_=Integer)


def record(stmt: Select[Any], claimed: CTE) -> Select[Any]:
    """``stmt`` (a claim whose activated rows are the CTE ``claimed``) that also records
    each job it activates as ``:claim_owner``'s, and makes that owner's liveness row if
    it has none yet (alive from now for ``:claim_lapse``). A row of an earlier attempt
    of the same job is overwritten."""
    c = claimed.c
    rows = select(c.id, c.name, c.started_on, owner())
    ins = insert(CLAIM).from_select(["job_id", "name", "started_on", "owner"], rows)
    ins = ins.on_conflict_do_update(
        index_elements=[CLAIM.c.job_id],
        set_={
            "name": ins.excluded.name,
            "started_on": ins.excluded.started_on,
            "owner": ins.excluded.owner,
        },
    )
    alive = (
        insert(CLAIMER)
        .values(owner=owner(), renewed_on=func.now(), lapse_seconds=lapse())
        .on_conflict_do_nothing(index_elements=[CLAIMER.c.owner])
    )
    return stmt.add_cte(ins.cte("noted"), alive.cte("alive"))


@functools.cache
def renew() -> Any:
    """The keeper's renewal: ``:claim_owner`` is alive from now for ``:claim_lapse``."""
    ins = insert(CLAIMER).values(owner=owner(), renewed_on=func.now(), lapse_seconds=lapse())
    return ins.on_conflict_do_update(
        index_elements=[CLAIMER.c.owner],
        set_={"renewed_on": ins.excluded.renewed_on, "lapse_seconds": ins.excluded.lapse_seconds},
    )


def _lapsed(c: Any) -> Any:
    o = CLAIMER.alias("o")
    return ~exists().where(
        o.c.owner == c.owner,
        o.c.renewed_on + seconds(o.c.lapse_seconds) >= func.now(),
    )


def victims() -> CTE:
    """``(name, id)`` of at most ``:limit`` jobs of queues ``:names`` active in an attempt
    our worker claimed and whose worker stopped renewing, row-locked (``SKIP LOCKED``)."""
    j = JOB.alias("j")
    c = CLAIM.alias("c")
    return (
        select(j.c.name, j.c.id)
        .select_from(c)
        .join(j, and_(j.c.name == c.c.name, j.c.id == c.c.job_id))
        .where(
            c.c.name == any_name(),
            j.c.state == state_text(JobState.ACTIVE),
            j.c.started_on == c.c.started_on,
            _lapsed(c.c),
        )
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=j, skip_locked=True)
        .cte("victims")
    )


def rescued() -> CTE:
    """The ``deleted`` CTE of the fail (sql/v26/fail.py's shape) for :func:`victims`,
    with ``:timeout_output`` (JSON text) as the new output."""
    v = victims()
    return (
        delete(JOB)
        .where(JOB.c.name == v.c.name, JOB.c.id == v.c.id)
        .returning(*JOB.c, cast(bindparam("timeout_output", type_=Text), JSONB).label("new_output"))
        .cte("deleted")
    )


@functools.cache
def forget() -> Any:
    """Remove up to :data:`FORGET_BATCH` rows of attempts that ended (their job is gone,
    not active, or active in another attempt), and claimers lapsed a day ago."""
    c = CLAIM.alias("c")
    j = JOB.alias("j")
    current = exists().where(
        j.c.name == c.c.name,
        j.c.id == c.c.job_id,
        j.c.state == state_text(JobState.ACTIVE),
        j.c.started_on == c.c.started_on,
    )
    ended = select(c.c.job_id).where(~current).limit(FORGET_BATCH)
    return delete(CLAIM).where(CLAIM.c.job_id.in_(ended))


@functools.cache
def forget_claimers() -> Any:
    """Remove the rows of claimers lapsed for :data:`CLAIMER_KEPT_SECONDS`."""
    kept = literal(CLAIMER_KEPT_SECONDS, Integer)
    return delete(CLAIMER).where(
        CLAIMER.c.renewed_on + seconds(CLAIMER.c.lapse_seconds + kept) < func.now()
    )
