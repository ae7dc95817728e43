"""The dashboard's Starlette application (the "Browse and act in the dashboard" page).

Every page and action reads and writes through :class:`~alkstore_sa.QueueService`,
in a session of its own with ``statement_timeout`` set for the transaction, run in
Starlette's thread pool (the engine is a plain synchronous one).

The pages are in ``_pages``, the actions in ``_actions``, the state they share
(settings, CSRF, flash messages, transactions) in ``_state``, the Jinja
environment in ``_render``, and the request-security layer in ``_security``;
this module wires them into an application and maps exceptions to error pages.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..backends import Backend
from ..errors import AlkstoreError, QueueNotFoundError, SchemaFeatureError
from ._actions import action, save_queue, send_job
from ._auth import AuthHook
from ._pages import (
    health_page,
    healthz,
    instances_page,
    job_detail,
    job_list,
    live_switch,
    metrics,
    overview,
    queue_detail,
    schedules_page,
    style,
    warnings_page,
)
from ._security import SecurityMiddleware
from ._state import BadRequest, Dashboard

__all__ = ["AuthHook", "Dashboard", "create_app"]


# ------------------------------------------------------------------ errors


async def _bad_request(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    return d.error(request, 400, str(exc))


async def _service_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    if isinstance(exc, QueueNotFoundError):
        return d.error(request, 404, str(exc))
    if isinstance(exc, SchemaFeatureError):
        return d.error(request, 400, str(exc))
    return d.error(request, 400, str(exc))


async def _database_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    orig = getattr(exc, "orig", None)
    reason = " ".join(str(orig if orig is not None else exc).split())[:300]
    return d.error(request, 503, f"database error: {reason}")


async def _http_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    assert isinstance(exc, HTTPException)
    return d.error(request, exc.status_code, str(exc.detail))


def create_app(
    engine: Engine,
    *,
    schemas: Sequence[str] = ("pgboss",),
    read_only: bool = False,
    auth: AuthHook | None = None,
    basic_auth: tuple[str, str] | None = None,
    statement_timeout_ms: int = 5000,
    secret_key: str | bytes | None = None,
    title: str = "alkstore",
    allowed_hosts: Sequence[str] | None = None,
    backend: str | Backend | None = None,
    refresh_seconds: int = 5,
) -> Starlette:
    """The dashboard as a Starlette application (the "Browse and act in the dashboard" page).

    :param engine: a synchronous SQLAlchemy engine on the database.
    :param schemas: the queue schemas to show.
    :param read_only: show no action and refuse every POST (403).
    :param auth: the mounting application's check, ``(request) -> bool`` (or
        awaitable); false answers 403.
    :param basic_auth: ``(username, password)`` for HTTP basic authentication.
    :param statement_timeout_ms: ``statement_timeout`` of every request's
        transaction (0: none).
    :param secret_key: signs the CSRF tokens and flash messages; random per
        process when not given (tokens then end with the process).
    :param title: shown in the page titles.
    :param allowed_hosts: ``Host`` names (no port) requests may carry besides
        loopback ones (``localhost``, ``127.0.0.1``, ``[::1]``); ``"*"`` for any.
        Not given: without authentication loopback names only, which keeps out a
        page on another site whose name was rebound to 127.0.0.1; with
        authentication, any.
    :param backend: the database backend profile (the "Database backends" page), as
        :class:`~alkstore_sa.QueueService` takes it.
    :param refresh_seconds: how often the pages without forms (the overview, instances
        and warnings) reload themselves, 1 to 3600; 0: never. Each viewer can pause it
        with one click (a cookie), and it needs no script.
    :raises InvalidOptionsError: for a bad argument.
    """
    dashboard = Dashboard(
        engine,
        schemas=schemas,
        read_only=read_only,
        auth=auth,
        basic_auth=basic_auth,
        statement_timeout_ms=statement_timeout_ms,
        secret_key=secret_key,
        title=title,
        allowed_hosts=allowed_hosts,
        backend=backend,
        refresh_seconds=refresh_seconds,
    )
    routes = [
        Route("/", overview),
        Route("/live", live_switch),
        Route("/healthz", healthz),
        Route("/metrics", metrics),
        Route("/static/style.css", style),
        Route("/s/{schema}/queues/{name:path}", queue_detail),
        Route("/s/{schema}/queues", save_queue, methods=["POST"]),
        Route("/s/{schema}/send", send_job, methods=["POST"]),
        Route("/s/{schema}/jobs", job_list),
        Route("/s/{schema}/jobs/{id}", job_detail),
        Route("/s/{schema}/schedules", schedules_page),
        Route("/s/{schema}/instances", instances_page),
        Route("/s/{schema}/warnings", warnings_page),
        Route("/s/{schema}/health", health_page),
        Route("/s/{schema}/actions/{action}", action, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityMiddleware, dashboard=dashboard)],
        exception_handlers={
            BadRequest: _bad_request,
            AlkstoreError: _service_error,
            DBAPIError: _database_error,
            PoolTimeoutError: _database_error,  # every pooled connection busy
            HTTPException: _http_error,
        },
    )
    app.state.dashboard = dashboard
    return app
