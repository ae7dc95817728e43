"""``alkstore db upgrade|downgrade|current|sql|check``."""

from __future__ import annotations

import argparse
from typing import Any

from .. import migrate, schema_health
from ..backends import resolve as resolve_backend
from ..errors import SchemaHealthError, SchemaVersionError
from ..names import SCHEMA_VERSION
from ..schema_versions import NO_VERSION_ROW
from ._common import CommandError, emit, engine_from, leaf, schema_of


def register(sub: Any) -> None:
    db = sub.add_parser("db", help="create, inspect and remove the queue schema")
    actions = db.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = leaf(
        actions,
        "upgrade",
        f"create (or adopt) the pg-boss schema, at version {migrate.DEFAULT_SCHEMA_VERSION} "
        "unless told",
    )
    up.add_argument("revision", nargs="?", default=None)
    _schema_version_option(up, "the pg-boss schema version to migrate to")
    _attempt_history_option(up)
    up.set_defaults(handler=_upgrade)

    down = leaf(actions, "downgrade", "migrate back, or remove it all (jobs included)")
    down.add_argument("revision", nargs="?", default=None)
    _schema_version_option(down, "the pg-boss schema version to migrate back to")
    down.set_defaults(handler=_downgrade)

    leaf(
        actions, "current", "show the pg-boss schema version and the Node releases that speak it"
    ).set_defaults(handler=_current)
    sql = leaf(actions, "sql", "print the upgrade script (no database needed)")
    sql.add_argument("revision", nargs="?", default=None)
    _schema_version_option(sql, "the pg-boss schema version the script migrates to")
    _attempt_history_option(sql)
    sql.set_defaults(handler=_sql)
    leaf(
        actions,
        "check",
        "exit 1 unless a spoken schema version is installed with its catalog and every "
        "index built; lists what differs",
    ).set_defaults(handler=_check)


def _schema_version_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument(
        "--schema-version",
        type=int,
        metavar="N",
        help=f"{help} ({migrate.OLDEST_SCHEMA_VERSION} to {migrate.NEWEST_SCHEMA_VERSION})",
    )


def _attempt_history_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-attempt-history",
        dest="attempt_history",
        action="store_false",
        help="leave out our tables beside pg-boss's: the attempt history, "
        "alkstore_job_attempt (every failed attempt's error), and at schema 26 the claim "
        "records alkstore_claim and alkstore_claimer (a crashed worker's jobs back within "
        "a minute); on by default",
    )


def _wanted(args: argparse.Namespace) -> int | None:
    """The schema version the upgrade aims at, if it names one (or the default)."""
    if args.schema_version is not None:
        return int(args.schema_version)
    if args.revision is None:
        return migrate.DEFAULT_SCHEMA_VERSION
    return migrate.version_of(args.revision)


def _upgrade(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    wanted = _wanted(args)
    if wanted is not None:
        migrate.schema_version_info(wanted)  # an unknown version: exit 2, before connecting
    with engine_from(args) as engine:
        # A profile with noTablePartitioning (cockroachdb, yugabytedb) builds pg-boss's
        # plain tables; the others build PostgreSQL's schema.
        backend = resolve_backend(args.backend, dialect=engine.dialect.name)
        # Read under the migration lock: an upgrade that waited for another finds its work.
        result = migrate.upgrade(
            engine,
            schema,
            args.revision,
            schema_version=args.schema_version,
            backend=backend,
            attempt_history=args.attempt_history,
        )
        before, found, revision = result.before, result.found, result.revision
        healed = list(result.healed)
        version: int | None = None
        if wanted == SCHEMA_VERSION:
            # A schema recorded at our revision may still have been moved on by a newer
            # Node pg-boss since; say so instead of reporting success.
            version = migrate.check(engine, schema)
        elif wanted is not None:
            version = migrate.current_version(engine, schema)
            if version != wanted:
                raise CommandError(
                    f"schema {schema!r} is at pg-boss schema version {version}, not {wanted}: "
                    f"a newer Node pg-boss migrated it past our revision {revision}"
                )
    if revision == before:
        status, message = "unchanged", _already(version, revision)
        if healed:
            status, message = "healed", f"at {_at(version, revision)}; healed: " + "; ".join(healed)
    elif before is None and found in migrate.SCHEMA_VERSIONS:
        status, message = "adopted", f"adopted the schema {found} Node pg-boss created"
        if version is not None and version != found:
            message += f", then upgraded it to schema {version}"
    else:
        status, message = "upgraded", f"upgraded to {_at(version, revision)}"
    if healed and status != "healed":
        message += "; " + "; ".join(healed)
    if result.attempt_history and before is not None:
        if status == "unchanged":
            status = "upgraded"
        message += "; created the attempt history table alkstore_job_attempt"
    shown: dict[str, object] = {
        "schema": schema,
        "status": status,
        "revision": revision,
        "message": message,
    }
    if healed or args.json:
        shown["healed"] = healed  # the message says it too; one line each in JSON
    emit(args, shown)
    return 0


def _downgrade(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    if args.schema_version is not None:
        migrate.schema_version_info(args.schema_version)  # exit 2, before connecting
    with engine_from(args) as engine:
        before = migrate.current(engine, schema)
        # Nothing recorded: Alembic would do nothing, and a schema Node pg-boss
        # created (no revision of ours) must not be touched.
        if before is not None:
            migrate.downgrade(engine, schema, args.revision, schema_version=args.schema_version)
        revision = migrate.current(engine, schema)
    if before is None:
        status, message = "unchanged", "nothing to downgrade: no alkstore revision is recorded"
    elif revision == before:
        status, message = "unchanged", f"already at {_at(migrate.version_of(revision), revision)}"
    elif revision is None:
        status, message = "downgraded", "removed the queue schema objects"
    else:
        at = _at(migrate.version_of(revision), revision)
        status, message = "downgraded", f"downgraded to {at}"
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
        version = migrate.current_version(engine, schema)
    known = migrate.SCHEMA_VERSIONS.get(version) if version is not None else None
    if version is None:
        message = "not installed"
    elif version == NO_VERSION_ROW:
        version, message = None, "a pg-boss version table without a version row"
    elif known is None:
        message = f"schema {version} (not a version alkstore_sa knows)"
    else:
        message = known.describe()
    recorded = migrate.version_of(revision)
    if revision is not None and version is not None and recorded != version:
        # Node pg-boss migrates a schema it starts on without telling Alembic.
        message += f"; our revision {revision} left it at {recorded}"
    emit(
        args,
        {
            "schema": schema,
            "revision": revision,
            "version": version,
            "node_releases": known.node_releases if known is not None else None,
            "message": message,
        },
    )
    return 0


def _sql(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    script = migrate.offline_sql(
        schema,
        args.revision,
        schema_version=args.schema_version,
        attempt_history=args.attempt_history,
    )
    print(script, end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with engine_from(args) as engine:
        try:
            diagnosis = migrate.check_health(engine, schema)
        except (SchemaHealthError, SchemaVersionError):
            # Every difference on stdout first (one line each, or JSON), also for a
            # version the runtime does not speak but whose catalog we know; the exception
            # then gives the one-line error and exit 1.
            with engine.connect() as conn:
                found = schema_health.diagnose(conn, schema)
            if found.findings:
                _report(args, schema, found, "failed")
            raise
    _report(args, schema, diagnosis, "ok")
    return 0


def _report(
    args: argparse.Namespace, schema: str, diagnosis: schema_health.Diagnosis, status: str
) -> None:
    findings = [f.as_dict() for f in diagnosis.findings]
    if args.json:
        emit(
            args,
            {
                "schema": schema,
                "version": diagnosis.version,
                "status": status,
                "findings": findings,
                "closest_version": diagnosis.closest,
                "profile": diagnosis.profile,
            },
        )
        return
    shown: dict[str, object] = {"schema": schema, "version": diagnosis.version, "status": status}
    if diagnosis.profile != "postgres":
        shown["profile"] = diagnosis.profile  # the catalog compared: that backend's
    emit(args, shown)
    for finding in diagnosis.findings:
        print(f"{finding.severity.value}: {finding}")
    if diagnosis.closest is not None:
        print(f"refuse: the catalog is closest to schema version {diagnosis.closest}'s")
