"""One check for "bad input is refused and the caller's transaction goes on"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from alkstore_sa import InvalidOptionsError


def refused_in_transaction(
    env: Any,
    queue: str,
    call: Callable[[Any], Any],
    error: type[Exception] = InvalidOptionsError,
    then: Callable[[Any], Any] | None = None,
) -> Any:
    """``call(service)`` raises ``error`` in a transaction where the caller first sent
    a job of its own to ``queue``; ``then(service)``, if given, runs after the error in
    the same transaction; the transaction commits, and the caller's job is there.
    Returns the error, for the test to check what it names."""
    svc = env.service()
    mine = svc.send(queue, {"mine": 1})
    with pytest.raises(error) as caught:
        call(svc)
    if then is not None:
        then(svc)
    env.commit()
    assert env.sql("SELECT count(*) FROM {s}.job WHERE id = :id", id=mine) == [(1,)]
    return caught.value
