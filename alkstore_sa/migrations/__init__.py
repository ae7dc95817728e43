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
    """Kept for compatibility: every :class:`SchemaVersionError` now carries the advice."""

    def __init__(self, schema: str, found: int | None) -> None:
        super().__init__(schema, found, SCHEMA_VERSION)
