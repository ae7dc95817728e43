"""A pretend pg-boss schema 47, for the test of the version seam only.

It is schema 46 with one column added (``job.completed_by``) and one statement
changed (completing a job also writes that column). Its statement set inherits
46's and overrides that one statement; everything else the runtime does at 47 it
does through the seam: the set registered at or below the version
(:func:`alkstore_sa.sql.statements.statements_for`), the feature table (a feature
of 46 is a feature of 47) and the spoken versions
(:data:`alkstore_sa.names.SPOKEN_SCHEMA_VERSIONS`). Nothing in the package knows 47.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from sqlalchemy import Column, Engine, Executable, MetaData, Table, Text, Update, literal, text

from alkstore_sa.sql.common import settling
from alkstore_sa.sql.statements import Statements46, register_statements, unregister_statements
from alkstore_sa.sql.v46 import job_now
from alkstore_sa.sql.v46 import tables as tables46

VERSION = 47

COMPLETED_BY = "alkstore_sa at 47"
"""What 47's completion writes into the new column."""


def _job47() -> Table:
    """47's job table: 46's and the new column (in the same placeholder schema)."""
    metadata = MetaData(schema=tables46.metadata.schema)
    job = tables46.JOB.to_metadata(metadata)
    job.append_column(Column("completed_by", Text))
    return job


JOB = _job47()


@functools.cache
def _complete_jobs47() -> Update:
    return settling.complete(JOB, job_now()).values(completed_by=literal(COMPLETED_BY, Text))


class Statements47(Statements46):
    """47's set: 46's, but completing also writes ``completed_by``."""

    version: ClassVar[int] = VERSION
    job: ClassVar[Table] = JOB

    def complete_jobs(self) -> Executable:
        return _complete_jobs47()


def migrate_46_to_47(engine: Engine, schema: str) -> None:
    """What 47's revision would do to a schema at 46: add the column, stamp the version."""
    with engine.begin() as conn:
        conn.execute(text(f'ALTER TABLE "{schema}".job ADD COLUMN completed_by text'))
        conn.execute(text(f'UPDATE "{schema}".version SET version = {VERSION}'))


def speak_47() -> Any:
    """Plug 47 in: register its set (undo with the returned callable)."""
    register_statements(Statements47)
    return lambda: unregister_statements(VERSION)
