"""Keep your ``alembic revision --autogenerate`` blind to the queue schema.

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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

from alembic.runtime.environment import IncludeNameFn, IncludeObjectFn, NameFilterParentNames
from sqlalchemy import Table
from sqlalchemy.sql.schema import SchemaItem

from .migrations import VERSION_TABLE
from .models import metadata as alkstore_metadata
from .names import DEFAULT_SCHEMA, validate_schema

__all__ = ["AlkstoreFilters", "FilterOptions", "combine", "include_name", "include_object"]


class FilterOptions(TypedDict):
    """Keyword arguments for ``context.configure``."""

    include_name: IncludeNameFn
    include_object: IncludeObjectFn


def _schema_from_context() -> str:
    # Outside a running Alembic command (no config proxy) there is no -x to read.
    try:
        from .migrations import schema_name

        return schema_name()
    except (NameError, AttributeError):
        return DEFAULT_SCHEMA


class AlkstoreFilters:
    """``include_name`` and ``include_object`` hiding the queue schema(s).

    :param schemas: the queue schemas; by default the one the migrations target.
    :param include_name: your own name filter, consulted for everything else.
    :param include_object: your own object filter, consulted for everything else.

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
    ) -> None:
        self._schemas = None if schemas is None else frozenset(map(validate_schema, schemas))
        self._user_name = include_name
        self._user_object = include_object

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

    def options(self) -> FilterOptions:
        """``{"include_name": ..., "include_object": ...}`` for ``context.configure``."""
        return {"include_name": self.include_name, "include_object": self.include_object}


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
) -> FilterOptions:
    """Our filters wrapped around yours, ready for ``context.configure(**...)``.

    Your filters see only what ours let through.

    >>> opts = combine(include_name=lambda name, type_, parents: name != "legacy")
    >>> sorted(opts)
    ['include_name', 'include_object']
    """
    return AlkstoreFilters(
        schemas, include_name=include_name, include_object=include_object
    ).options()
