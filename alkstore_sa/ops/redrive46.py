"""Redrive at schema 46: dead-letter copies back to their source queue, as pg-boss
12.38 does (:mod:`alkstore_sa.sql.v46.redrive` says what moves and how)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import options as opt
from ..errors import InvalidOptionsError, shown
from ..names import queue_ref
from ..sql.v46 import redrive as redrive46_sql
from ._core import Call, Context, Op

_log = logging.getLogger(__name__)


FILTERS = ("source_name", "data", "created_before")
"""The redrive filters of schema 46 (pg-boss 12.38's ``sourceName``, ``data``,
``createdBefore``), on top of ``ids``."""


def check_filters(filters: Mapping[str, Any]) -> dict[str, Any]:
    """The filters given (not ``None``) as statement parameters, checked before any
    statement: ``source_name`` a queue name, ``data`` a JSON object the copy's data
    must contain, ``created_before`` an aware datetime."""
    params: dict[str, Any] = {"from_source": None, "contains": None, "created_before": None}
    source = filters.get("source_name")
    if source is not None:
        params["from_source"] = queue_ref(source, "source_name")
    data = filters.get("data")
    if data is not None:
        if not isinstance(data, Mapping):
            raise InvalidOptionsError(
                "data", f"must be a JSON object (a mapping), not {shown(data)}"
            )
        params["contains"] = opt.encode_json("data", dict(data))
    before = filters.get("created_before")
    if before is not None:
        params["created_before"] = opt.in_utc("created_before", before)
    return params


class _Moved(NamedTuple):
    new_id: uuid.UUID | None
    destination: str | None
    inserted: bool


def _split(ctx: Context, params: Mapping[str, Any], *, skip_locked: bool) -> Op[list[_Moved]]:
    """The redrive as separate statements in the caller's transaction
    (``noMultiMutationCte``, see :class:`~alkstore_sa.sql.v46.redrive.SplitRedrive`);
    the rows the one statement answers."""
    split = redrive46_sql.redrive_split(skip_locked=skip_locked)
    picked = (yield Call(split.pick, params)).all()
    if not picked:
        return []
    given = {
        **params,
        "cand_ids": [p.id for p in picked],
        "new_ids": [p.new_id for p in picked],
    }
    made = {r.id: r.name for r in (yield Call(split.insert, given)).all()}
    moved = [p.id for p in picked if p.new_id in made]
    skipped = [p.id for p in picked if p.new_id not in made]
    if moved:
        yield Call(split.remove, {"qname": params["qname"], "moved": moved})
    if skipped:
        yield Call(split.fail_conflicts, {**params, "skipped": skipped})
    return [
        _Moved(p.new_id, made[p.new_id], True) if p.new_id in made else _Moved(None, None, False)
        for p in picked
    ]


def redrive46(
    ctx: Context,
    dead_letter: str,
    to: str | None,
    ids: list[uuid.UUID] | None,
    limit: int,
    filters: Mapping[str, Any],
) -> Op[list[uuid.UUID]]:
    """Move up to ``limit`` waiting copies of ``dead_letter`` (narrowed by ``ids`` and
    the checked ``filters`` of :func:`check_filters`) to ``to``, or each to its
    ``source_name``; returns the new ids, oldest copy first. The caller has checked
    the arguments and that the queues exist.
    """
    params: dict[str, Any] = {
        "qname": dead_letter,
        "to": to,
        "ids": ids,
        "limit": limit,
        **filters,
    }
    skip_locked = not ctx.backend.has("noSkipLocked")
    rows: list[Any]
    if ctx.sql.splits_mutations:
        rows = list((yield from _split(ctx, params, skip_locked=skip_locked)))
    else:
        stmt = redrive46_sql.redrive_jobs(skip_locked=skip_locked)
        rows = list((yield Call(stmt, params)).all())
    moved: list[uuid.UUID] = [r.new_id for r in rows if r.inserted]
    conflicted = sum(1 for r in rows if not r.inserted)
    if conflicted:
        _log.warning(
            "%d job(s) of %s not redriven: their queue refused them (failed in place, "
            "output reason redrive_conflict)",
            conflicted,
            dead_letter,
            extra={"action": "redrive_conflict", "queue": dead_letter, "count": conflicted},
        )
    queues: list[str] = sorted({r.destination for r in rows if r.inserted})
    if ctx.notify and queues:
        yield Call(redrive46_sql.announce(), {"channel": ctx.channel, "queues": queues})
    return moved
