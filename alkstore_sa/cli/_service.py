"""What the queue, send, jobs and schedule commands share: a service in one transaction.

Their queue and send options are generated from the option table in ``_options``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.orm import Session

from ..service import QueueService
from ._common import engine_from, schema_of

T = TypeVar("T")

JOB_COLUMNS = (
    "id",
    "state",
    "priority",
    "retry_count",
    "retry_limit",
    "singleton_key",
    "created_on",
    "start_after",
    "completed_on",
    "data",
)
"""Columns of the job tables printed by ``jobs list`` (``--json`` prints every field;
a table cuts ``data``, as any JSON cell, to ``_common.JSON_CELL_WIDTH`` characters)."""


def in_transaction(args: argparse.Namespace, work: Callable[[QueueService], T]) -> T:
    """Run ``work(service)`` in one transaction, committed if it returns.

    Whatever it raises rolls the transaction back and reaches ``main``, which
    reports it.
    """
    schema = schema_of(args)
    with engine_from(args) as engine, Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema, backend=args.backend))
