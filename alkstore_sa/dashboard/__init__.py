"""A small web dashboard over the queue schemas: queues, jobs, schedules,
workers, warnings, and the operator's actions (the "Browse and act in the dashboard" page).

Needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn, python-multipart);
``import alkstore_sa`` never imports it.

* :func:`create_app` returns a Starlette application: serve it with uvicorn, or
  mount it in your own Starlette or FastAPI application.
* :func:`check_bind` refuses to expose an unauthenticated dashboard beyond the
  local machine; :func:`serve` checks, then runs uvicorn on a socket bound by
  :func:`listen` (bind first, so a busy port is an error before anything is announced).
"""

from __future__ import annotations

from .._extras import missing_extra
from .._hosts import listen

try:
    from ._app import create_app
    from ._serve import check_bind, serve
except ModuleNotFoundError as exc:
    raise missing_extra("alkstore_sa.dashboard", "dashboard", exc) from exc

__all__ = ["check_bind", "create_app", "listen", "serve"]
