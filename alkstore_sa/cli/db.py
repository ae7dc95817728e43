"""``alkstore db upgrade|downgrade|current|sql|check``."""

from __future__ import annotations

import argparse
from typing import Any

from .. import migrate
from ._common import emit, engine_from, guarded, leaf, schema_of


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
        guarded(lambda: migrate.upgrade(engine, schema, args.revision))
        revision = guarded(lambda: migrate.current(engine, schema))
        if args.revision == migrate.HEAD:
            # A schema recorded at our head may still have been moved on by a newer
            # Node pg-boss since; say so instead of reporting success.
            guarded(lambda: migrate.check(engine, schema))
    emit(args, {"schema": schema, "status": "upgraded", "revision": revision})
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        guarded(lambda: migrate.downgrade(engine, schema, args.revision))
        revision = guarded(lambda: migrate.current(engine, schema))
    emit(args, {"schema": schema, "status": "downgraded", "revision": revision})
    return 0


def _current(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        revision = guarded(lambda: migrate.current(engine, schema))
    emit(args, {"schema": schema, "revision": revision})
    return 0


def _sql(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    print(guarded(lambda: migrate.offline_sql(schema, args.revision)), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        version = guarded(lambda: migrate.check(engine, schema))
    emit(args, {"schema": schema, "version": version, "status": "ok"})
    return 0
