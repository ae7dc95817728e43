"""An HTTP API for the queue (the "HTTP API" page): :class:`~alkstore_sa.QueueService`'s
operations over JSON, for services in other runtimes, with an OpenAPI 3.1 document.

Needs the ``api`` extra (Starlette, and uvicorn for ``alkstore api``)::

    from alkstore_sa.api import create_app

    app = create_app(engine, auth=["a-long-random-token"])
"""

from __future__ import annotations

from .._extras import missing_extra

try:
    from ._app import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY_BYTES, TokenCheck, create_app
    from ._openapi import openapi_document
except ModuleNotFoundError as exc:
    raise missing_extra("alkstore_sa.api", "api", exc) from exc

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_MAX_BODY_BYTES",
    "TokenCheck",
    "create_app",
    "openapi_document",
]
