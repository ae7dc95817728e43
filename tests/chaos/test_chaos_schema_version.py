"""The schema migrated past version 26 (as Node pg-boss 12.6+ with ``migrate: true`` does).

Holds docs/concepts/guarantees.md on a schema another version migrated: a worker started
afterwards refuses it with ``SchemaVersionError`` and touches no job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, rows, states
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, SchemaVersionError

pytestmark = pytest.mark.chaos


def test_a_worker_started_on_a_schema_migrated_past_26_refuses_it_and_touches_no_job(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(30)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue("chaos")
        assert all(svc.send_many("chaos", [{"data": {"n": i}} for i in range(10)]))
    rows(engine, schema, "UPDATE {s}.version SET version = 27")
    with Children(database_url, schema, tmp_path) as kids:
        worker = kids.start("w0")
        code = worker.proc.wait(deadline.left())
        output = worker.output()
    print(f"\nschema version 27: worker exited {code}: {output.strip().splitlines()[-1]}")
    assert code == 1
    assert "27" in output and "26" in output
    assert states(engine, schema, "chaos") == {"created": 10}
    # The check runs once per engine and schema (docs/concepts/guarantees.md): a fresh
    # engine, as in a process started now, is refused before any statement on the jobs.
    fresh = create_engine(database_url)
    try:
        with Session(fresh) as s, pytest.raises(SchemaVersionError):
            QueueService(s, schema=schema).fetch("chaos")
    finally:
        fresh.dispose()
