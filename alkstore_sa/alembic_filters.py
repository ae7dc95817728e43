"""Keep your ``alembic revision --autogenerate`` blind to the queue schema and out of our package.

The queue tables belong to alkstore_sa's own revisions. Without a filter, an
application whose ``env.py`` sets ``include_schemas=True`` would see them (and every
runtime partition ``create_queue(partition=True)`` adds) as tables to drop. Pass our
filters to ``context.configure``::

    from alkstore_sa import alembic_filters

    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_schemas=True,
        **alembic_filters.combine(include_object=my_include_object),
    )

or, without filters of your own, ``include_name=alembic_filters.include_name,
include_object=alembic_filters.include_object``.

The queue schema is the one the migrations use (``-x alkstore_schema=NAME``, then
``config.attributes["alkstore_schema"]``, then the ``alkstore_schema`` option,
then ``pgboss``); pass ``schemas=`` to name it (or several) explicitly. Besides the
schema, the filters hide alkstore's own ``Table`` objects (should you add
:data:`alkstore_sa.models.metadata` to ``target_metadata``) and the revision table
``alkstore_alembic_version`` wherever it lives.

``combine`` also returns :func:`process_revision_directives`, a hook that refuses
to write one of your new revisions into alkstore_sa's package folder or onto its
``alkstore`` branch (which is where a plain ``alembic revision`` puts your first
revision, because our revision is then the only head). It fires for
``alembic revision --autogenerate``, and for plain ``alembic revision`` when
``alembic.ini`` sets ``revision_environment = true``.

And it returns :func:`on_version_apply`, which creates our attempt history table
(``alkstore_job_attempt``, the "Attempt history" page) in the queue schema after each of
our revisions runs upward, as ``alkstore db upgrade`` does after its revisions.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict

from alembic.operations.ops import MigrationScript
from alembic.runtime.environment import (
    IncludeNameFn,
    IncludeObjectFn,
    NameFilterParentNames,
    OnVersionApplyFn,
    ProcessRevisionDirectiveFn,
)
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import Script, ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import coerce_resource_to_filename
from sqlalchemy import Table
from sqlalchemy.sql.schema import SchemaItem

from .errors import shown
from .migrations import (
    OUR_VERSION_DIRS,
    REVISION_PREFIX,
    VERSION_TABLE,
    AlembicForeignRevisionError,
    attempts,
    refuse_foreign_revisions,
)
from .models import metadata as alkstore_metadata
from .names import DEFAULT_SCHEMA, validate_schema

__all__ = [
    "AlkstoreFilters",
    "FilterOptions",
    "combine",
    "include_name",
    "include_object",
    "process_revision_directives",
]


class FilterOptions(TypedDict):
    """Keyword arguments for ``context.configure``."""

    include_name: IncludeNameFn
    include_object: IncludeObjectFn
    process_revision_directives: ProcessRevisionDirectiveFn
    on_version_apply: OnVersionApplyFn


def _schema_from_context() -> str:
    # Outside a running Alembic command (no config proxy) there is no -x to read.
    try:
        from .migrations import schema_name

        return schema_name()
    except (NameError, AttributeError):
        return DEFAULT_SCHEMA


class AlkstoreFilters:
    """``include_name`` and ``include_object`` hiding the queue schema(s), and our revision hook.

    :param schemas: the queue schemas; by default the one the migrations target.
    :param include_name: your own name filter, consulted for everything else.
    :param include_object: your own object filter, consulted for everything else.
    :param process_revision_directives: your own hook, run before ours (ours checks
        the revisions as your hook leaves them).

    >>> filters = AlkstoreFilters(["jobs"])
    >>> filters.include_name("jobs", "schema", {})
    False
    >>> filters.include_name("public", "schema", {})
    True
    """

    def __init__(
        self,
        schemas: Iterable[str] | None = None,
        *,
        include_name: IncludeNameFn | None = None,
        include_object: IncludeObjectFn | None = None,
        process_revision_directives: ProcessRevisionDirectiveFn | None = None,
    ) -> None:
        self._schemas = None if schemas is None else frozenset(map(validate_schema, schemas))
        self._user_name = include_name
        self._user_object = include_object
        self._user_directives = process_revision_directives

    @property
    def schemas(self) -> frozenset[str]:
        """The schemas hidden from autogenerate."""
        if self._schemas is not None:
            return self._schemas
        return frozenset({_schema_from_context()})

    def include_name(
        self, name: str | None, type_: Any, parent_names: NameFilterParentNames
    ) -> bool:
        """Alembic's ``include_name`` hook: skip our schema before it is reflected."""
        if type_ == "schema" and name in self.schemas:
            return False
        if type_ == "table" and (
            name == VERSION_TABLE or parent_names.get("schema_name") in self.schemas
        ):
            return False
        if self._user_name is not None:
            return self._user_name(name, type_, parent_names)
        return True

    def include_object(
        self,
        obj: SchemaItem,
        name: str | None,
        type_: Any,
        reflected: bool,
        compare_to: SchemaItem | None,
    ) -> bool:
        """Alembic's ``include_object`` hook: skip our tables and everything on them."""
        if self._is_ours(obj) or (compare_to is not None and self._is_ours(compare_to)):
            return False
        if self._user_object is not None:
            return self._user_object(obj, name, type_, reflected, compare_to)
        return True

    def _is_ours(self, obj: SchemaItem) -> bool:
        table = obj if isinstance(obj, Table) else getattr(obj, "table", None)
        if not isinstance(table, Table):
            return False
        return (
            table.metadata is alkstore_metadata
            or table.name == VERSION_TABLE
            or table.schema in self.schemas
        )

    def process_revision_directives(
        self, context: MigrationContext, revision: Any, directives: list[MigrationScript]
    ) -> None:
        """Alembic's ``process_revision_directives`` hook: yours, then ours.

        Ours is :func:`process_revision_directives` (module level).
        """
        if self._user_directives is not None:
            self._user_directives(context, revision, directives)
        process_revision_directives(context, revision, directives)

    def options(self) -> FilterOptions:
        """The four hooks, by name, for ``context.configure(**...)``."""
        return {
            "include_name": self.include_name,
            "include_object": self.include_object,
            "process_revision_directives": self.process_revision_directives,
            "on_version_apply": on_version_apply,
        }


_default = AlkstoreFilters()


def include_name(name: str | None, type_: Any, parent_names: NameFilterParentNames) -> bool:
    """Alembic ``include_name`` hiding the queue schema the migrations target."""
    return _default.include_name(name, type_, parent_names)


def include_object(
    obj: SchemaItem, name: str | None, type_: Any, reflected: bool, compare_to: SchemaItem | None
) -> bool:
    """Alembic ``include_object`` hiding alkstore's tables and the queue schema's objects."""
    return _default.include_object(obj, name, type_, reflected, compare_to)


def combine(
    include_name: IncludeNameFn | None = None,
    include_object: IncludeObjectFn | None = None,
    *,
    schemas: Iterable[str] | None = None,
    process_revision_directives: ProcessRevisionDirectiveFn | None = None,
) -> FilterOptions:
    """Our filters and revision hook wrapped around yours, for ``context.configure(**...)``.

    Your filters see only what ours let through; your ``process_revision_directives``
    runs first and ours checks what it leaves.

    >>> opts = combine(include_name=lambda name, type_, parents: name != "legacy")
    >>> sorted(opts)
    ['include_name', 'include_object', 'on_version_apply', 'process_revision_directives']
    """
    return AlkstoreFilters(
        schemas,
        include_name=include_name,
        include_object=include_object,
        process_revision_directives=process_revision_directives,
    ).options()


def on_version_apply(
    ctx: MigrationContext,
    step: MigrationInfo,
    heads: Collection[Any],
    run_args: Mapping[str, Any],
) -> None:
    """Alembic hook: after one of our revisions ran upward online, create the attempt
    history table in the queue schema unless it is there (in the migration's
    transaction; nothing for your revisions, a downgrade, a stamp or ``--sql``).

    ``alembic upgrade heads`` in your environment then leaves what ``alkstore db upgrade``
    leaves; without the hook, :func:`alkstore_sa.migrate.install_attempt_history` does it.
    """
    revision = step.up_revision_id or ""
    if not revision.startswith(REVISION_PREFIX) or not step.is_upgrade or step.is_stamp:
        return
    if ctx.as_sql or ctx.connection is None:
        return
    attempts.install(ctx.connection, _schema_from_context())


def process_revision_directives(
    context: MigrationContext, revision: Any, directives: list[MigrationScript]
) -> None:
    """Alembic hook: refuse a new revision bound for alkstore_sa's folder or branch.

    Raises :class:`~alkstore_sa.errors.ForeignRevisionError` (as an Alembic
    ``CommandError``, so ``alembic`` prints one line) before anything is written when
    a new revision would

    * be written into alkstore_sa's ``versions`` folder, or
    * build on one of alkstore_sa's revisions (``--head`` resolving to ``alkstore@head``,
      as a plain ``alembic revision`` does while ours is the only head);

    and also when a revision of anybody else's already sits in that folder. The
    message says how to start your own branch instead.
    """
    refuse_foreign_revisions()
    script = context.script
    for directive in directives:
        if not isinstance(directive, MigrationScript):
            continue
        parents = _parents(script, directive.head)
        ours = [p.revision for p in parents if _is_ours(p)]
        folder = _destination(script, directive.version_path, parents)
        into_ours = folder is not None and folder in OUR_VERSION_DIRS
        if not ours and not into_ours:
            continue
        what = f"the new revision {shown(directive.rev_id)} would "
        if ours:
            what += (
                f"build on alkstore_sa's revision {shown(ours[0])} (--head "
                f"{directive.head or 'head'}), joining alkstore_sa's 'alkstore' branch"
            )
        if into_ours:
            what += (" and " if ours else "") + (
                f"be written into alkstore_sa's versions folder {folder}, where "
                "`alkstore db upgrade` would run it on every database"
            )
        raise AlembicForeignRevisionError(what + ". Nothing was written")


def _parents(script: ScriptDirectory | None, head: Any) -> list[Script]:
    if script is None:
        return []
    try:
        found = script.revision_map.get_revisions(head or "head")
    except RevisionError:
        return []  # Alembic itself reports an unknown head or several heads
    return [r for r in found if isinstance(r, Script)]


def _is_ours(rev: Script) -> bool:
    return rev.revision.startswith(REVISION_PREFIX) or (
        Path(rev.path).resolve().parent in OUR_VERSION_DIRS
    )


def _destination(
    script: ScriptDirectory | None, version_path: Any, parents: list[Script]
) -> Path | None:
    """The folder Alembic will write into, decided the way ``alembic revision`` does."""
    if version_path:
        return Path(os.fspath(version_path)).resolve()
    if parents:
        return Path(parents[0].path).resolve().parent
    if script is None:
        return None
    locations = script.version_locations
    if not locations:
        return Path(script.dir, "versions").resolve()
    if len(locations) == 1:
        return coerce_resource_to_filename(os.fspath(locations[0])).resolve()
    return None  # several locations and no parent: Alembic asks for --version-path
