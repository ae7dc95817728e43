"""Text that PostgreSQL cannot take (a lone surrogate, which is not valid UTF-8, or the
character U+0000) is refused with ``InvalidOptionsError`` naming the argument, before any
SQL: it raised a raw ``UnicodeEncodeError`` from the driver. The caller's transaction
goes on (its own write commits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.refusals import refused_in_transaction

from alkstore_sa import InvalidOptionsError

CALLS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "find_jobs key": ("key", lambda q, s: q.find_jobs("q", key=s)),
    "find_jobs group": ("group", lambda q, s: q.find_jobs("q", group=s)),
    "find_jobs text": ("text", lambda q, s: q.find_jobs(text=s)),
    "get_warnings": ("type", lambda q, s: q.get_warnings(s)),
    "get_blocked_keys": ("after", lambda q, s: q.get_blocked_keys("k", after=s)),
}


NUL = ["get_warnings", "get_blocked_keys"]  # find_jobs refused U+0000 already
CASES = [(c, b) for c in CALLS for b in ["a\ud800", "\udfff"]] + [(c, "a\x00b") for c in NUL]


@pytest.mark.parametrize(("call", "bad"), CASES, ids=[f"{c}-{b!a}" for c, b in CASES])
def test_text_postgresql_cannot_take_is_refused_naming_the_argument(
    env46_sync: Any, call: str, bad: str
) -> None:
    env = env46_sync
    env.tx(lambda q: (q.create_queue("q"), q.create_queue("k", policy="key_strict_fifo")))
    option, fn = CALLS[call]
    still: list[Any] = []  # the same call with fine text, after the refusal
    refused = refused_in_transaction(
        env, "q", lambda svc: fn(svc, bad), then=lambda svc: still.append(fn(svc, "fine"))
    )
    assert refused.option == option
    assert len(still) == 1 and still[0] is not None


def test_find_jobs_refuses_a_lone_surrogate_at_26(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    svc = env.service()
    mine = svc.send("q", {"mine": 1})
    with pytest.raises(InvalidOptionsError, match="lone surrogate"):
        svc.find_jobs("q", text="\ud800")
    assert [j.id for j in svc.find_jobs("q").jobs] == [mine]
    env.commit()
