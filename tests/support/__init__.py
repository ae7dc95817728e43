"""Helpers shared by the schema, migration and CLI tests."""
