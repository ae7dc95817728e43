"""A PgBouncer in front of the test database, one per test session and pool mode
(:func:`alkstore_sa.testing.pgbouncer.run_pgbouncer`, which the bench uses as well).

Skips when ``pgbouncer`` is not installed or does not start, unless under CI, which
installs it (``.ci/run``): then the test fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alkstore_sa.testing.pgbouncer import PgBouncerUnavailableError, run_pgbouncer

from .skips import unavailable


@contextlib.contextmanager
def pgbouncer(database_url: str, pool_mode: str) -> Iterator[str]:
    """A running PgBouncer in ``pool_mode`` for ``database_url``'s database; yields
    the URL of the same database through it."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(run_pgbouncer(database_url, pool_mode))
        except PgBouncerUnavailableError as exc:
            unavailable(str(exc))
        yield url
