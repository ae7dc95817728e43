"""``alkstore db upgrade|downgrade|current|sql|check``."""

from __future__ import annotations

import argparse
from typing import Any

from .. import migrate
from ..names import SCHEMA_VERSION
from ._common import emit, engine_from, leaf, schema_of


def register(sub: Any) -> None:
    db = sub.add_parser("db", help="create, inspect and remove the queue schema")
    actions = db.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = leaf(actions, "upgrade", "create (or adopt) the schema-26 objects")
    up.add_argument("revision", nargs="?", default=migrate.HEAD)
    up.set_defaults(handler=_upgrade)

    down = leaf(actions, "downgrade", "remove them (jobs included)")
    down.add_argument("revision", nargs="?", default=migrate.BASE)
    down.set_defaults(handler=_downgrade)

    leaf(actions, "current", "show the recorded revision").set_defaults(handler=_current)
    sql = leaf(actions, "sql", "print the upgrade script (no database needed)")
    sql.add_argument("revision", nargs="?", default=migrate.HEAD)
    sql.set_defaults(handler=_sql)
    leaf(actions, "check", "exit 1 unless schema version 26 is installed").set_defaults(
        handler=_check
    )


def _upgrade(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        before = migrate.current(engine, schema)
        with engine.connect() as conn:
            found = migrate.installed_version(conn, schema)
        migrate.upgrade(engine, schema, args.revision)
        revision = migrate.current(engine, schema)
        version: int | None = None
        if args.revision == migrate.HEAD:
            # A schema recorded at our head may still have been moved on by a newer
            # Node pg-boss since; say so instead of reporting success.
            version = migrate.check(engine, schema)
    if revision == before:
        status, message = "unchanged", _already(version, revision)
    elif before is None and found == SCHEMA_VERSION:
        status, message = "adopted", f"adopted the schema {SCHEMA_VERSION} Node pg-boss created"
    else:
        status, message = "upgraded", f"upgraded to {_at(version, revision)}"
    emit(
        args,
        {"schema": schema, "status": status, "revision": revision, "message": message},
    )
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        before = migrate.current(engine, schema)
        # Nothing recorded: Alembic would do nothing, and a schema Node pg-boss
        # created (no revision of ours) must not be touched.
        if before is not None:
            migrate.downgrade(engine, schema, args.revision)
        revision = migrate.current(engine, schema)
    if before is None:
        status, message = "unchanged", "nothing to downgrade: no alkstore revision is recorded"
    elif revision == before:
        status, message = "unchanged", f"already at revision {revision}"
    elif revision is None:
        status, message = "downgraded", "removed the queue schema objects"
    else:
        status, message = "downgraded", f"downgraded to revision {revision}"
    emit(
        args,
        {"schema": schema, "status": status, "revision": revision, "message": message},
    )
    return 0


def _already(version: int | None, revision: str | None) -> str:
    return f"already at {_at(version, revision)}; nothing to do"


def _at(version: int | None, revision: str | None) -> str:
    return f"schema {version}" if version is not None else f"revision {revision}"


def _current(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        revision = migrate.current(engine, schema)
    emit(args, {"schema": schema, "revision": revision})
    return 0


def _sql(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    print(migrate.offline_sql(schema, args.revision), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        version = migrate.check(engine, schema)
    emit(args, {"schema": schema, "version": version, "status": "ok"})
    return 0
