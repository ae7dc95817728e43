"""Redrive at schema 46: dead-letter copies back to their source queue, as pg-boss
12.38 does (:mod:`alkstore_sa.sql.v46.redrive` says what moves and how)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from ..sql.v46 import redrive as redrive46_sql
from ._core import Call, Context, Op

_log = logging.getLogger(__name__)


def redrive46(
    ctx: Context, dead_letter: str, to: str | None, ids: list[uuid.UUID] | None, limit: int
) -> Op[list[uuid.UUID]]:
    """Move up to ``limit`` waiting copies of ``dead_letter`` (``ids`` only, when
    given) to ``to``, or each to its ``source_name``; returns the new ids, oldest
    copy first. The caller has checked the arguments and that the queues exist.
    """
    params: dict[str, Any] = {"qname": dead_letter, "to": to, "ids": ids, "limit": limit}
    result = yield Call(redrive46_sql.redrive_jobs(), params)
    rows = result.all()
    moved = [r.new_id for r in rows if r.inserted]
    conflicted = sum(1 for r in rows if not r.inserted)
    if conflicted:
        _log.warning(
            "%d job(s) of %s not redriven: their queue refused them (failed in place, "
            "output reason redrive_conflict)",
            conflicted,
            dead_letter,
            extra={"action": "redrive_conflict", "queue": dead_letter, "count": conflicted},
        )
    queues = sorted({r.destination for r in rows if r.inserted})
    if ctx.notify and queues:
        yield Call(redrive46_sql.announce(), {"channel": ctx.channel, "queues": queues})
    return moved
