"""Alembic revisions for the queue schema, shipped inside the package.

Three ways to run them:

* from your own Alembic environment: add ``alkstore_sa:migrations/versions`` to
  ``version_locations`` and run ``alembic upgrade alkstore@head`` (or ``heads``);
* standalone: ``alkstore db upgrade --database-url URL --schema S``
  (see :mod:`alkstore_sa.migrate`);
* offline: ``alembic upgrade alkstore@head --sql`` or ``alkstore db sql``.

The schema comes from :func:`schema_name`.
"""

from __future__ import annotations

from alembic import context

from ..errors import SchemaVersionError
from ..names import DEFAULT_SCHEMA, SCHEMA_VERSION, validate_schema

BRANCH_LABEL = "alkstore"
"""Branch label carried by every revision; ``alembic upgrade alkstore@head``."""

VERSION_TABLE = "alkstore_alembic_version"
"""Alembic version table used by the standalone environment (inside the target schema)."""

SCHEMA_OPTION = "alkstore_schema"
"""Name of the ``-x`` argument and ``alembic.ini`` main option choosing the schema."""


def schema_name() -> str:
    """The schema the running migration targets.

    Looked up, in order, in ``-x alkstore_schema=NAME``, in
    ``config.attributes["alkstore_schema"]``, in the ``alkstore_schema`` main option of
    the Alembic config, and finally defaults to ``pgboss``.
    """
    x_args = context.get_x_argument(as_dictionary=True)
    value = x_args.get(SCHEMA_OPTION)
    if value is None:
        value = context.config.attributes.get(SCHEMA_OPTION)
    if value is None:
        value = context.config.get_main_option(SCHEMA_OPTION)
    return validate_schema(value or DEFAULT_SCHEMA)


class UnsupportedSchemaVersionError(SchemaVersionError):
    """The schema holds pg-boss objects at a version other than 26.

    The message names the version found and what to do about it; nothing has been
    changed in the database.
    """

    def __init__(self, schema: str, found: int | None) -> None:
        super().__init__(schema, found, SCHEMA_VERSION)
        self.args = (_advice(schema, found),)


def _advice(schema: str, found: int | None) -> str:
    head = f"schema {schema!r} "
    if found is None:
        return (
            head + f"has a pg-boss version table but no version row, so its schema version "
            f"is unknown (alkstore_sa needs {SCHEMA_VERSION}); if it really holds a "
            f"pg-boss 11.1/12.0-12.5 schema, insert the row ({SCHEMA_VERSION}) and retry, "
            "otherwise choose another schema"
        )
    if found == SCHEMA_VERSION - 1:
        return (
            head + f"is at pg-boss schema version {found} (pg-boss 11.0.x), alkstore_sa needs "
            f"{SCHEMA_VERSION}; start Node pg-boss 11.1.x once against it (it migrates "
            f"{found} to {SCHEMA_VERSION}) and run the upgrade again"
        )
    if found < SCHEMA_VERSION:
        return (
            head + f"is at pg-boss schema version {found} (pg-boss 10.x or older), alkstore_sa "
            f"needs {SCHEMA_VERSION} and pg-boss offers no upgrade path from it: drain or "
            "move its jobs and install into a fresh schema"
        )
    return (
        head + f"is at pg-boss schema version {found}, newer than the version "
        f"{SCHEMA_VERSION} alkstore_sa speaks (pg-boss 12.6 or later migrated it); use "
        "another schema for alkstore_sa, or keep Node pg-boss at 11.1.x-12.5.x on this one"
    )
