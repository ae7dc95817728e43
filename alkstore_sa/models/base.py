"""Our own DeclarativeBase and MetaData, kept apart from the application's."""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

from ..names import DEFAULT_SCHEMA

metadata = MetaData(schema=DEFAULT_SCHEMA)
"""All alkstore tables, declared in the placeholder schema ``pgboss``."""


class Base(DeclarativeBase):
    """Declarative base for the queue tables. Applications never inherit from it."""

    metadata = metadata
