"""Developer Alembic environment: the package's own ``env.py``, pointed at a database.

The database comes from ``ALKSTORE_DATABASE_URL`` (libpq or SQLAlchemy URL); the
schema from ``-x alkstore_schema=NAME`` or the ``alkstore_schema`` option of
``alembic.ini``. Everything else is the environment the package ships, so what
developers run here is exactly what ``alkstore db upgrade`` runs.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from alembic import context

import alkstore_sa.migrations
from alkstore_sa.migrate import normalise_url

config = context.config
# Callers that own logging (tests, tools) pass attributes["configure_logger"] = False.
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    from logging.config import fileConfig

    fileConfig(config.config_file_name, disable_existing_loggers=False)

url = os.environ.get("ALKSTORE_DATABASE_URL")
if url:
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
elif config.attributes.get("connection") is None and not context.is_offline_mode():
    raise SystemExit("set ALKSTORE_DATABASE_URL to the database the revisions should run on")

runpy.run_path(str(Path(alkstore_sa.migrations.__file__).with_name("env.py")))
