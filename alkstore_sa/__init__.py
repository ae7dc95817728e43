"""alkstore_sa: a PostgreSQL job queue for SQLAlchemy, schema-compatible with pg-boss 26."""
