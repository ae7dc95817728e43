"""Jobs sent in one transaction share ``created_on`` (``now()``): their ids, time-ordered
(version-7 UUIDs minted in send order), keep listings in the order they were sent."""

from __future__ import annotations

import uuid
from typing import Any

from alkstore_sa.ops.sending import _fresh_ids


def test_separate_sends_in_one_transaction_list_newest_first(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))

    def send_ten(q: Any) -> list[Any]:
        return [q.send("q", {"n": n}) for n in range(10)]

    sent = env.tx(send_ten)
    page = env.tx(lambda q: q.find_jobs("q"))
    assert [j.data["n"] for j in page.jobs] == list(range(9, -1, -1))
    listed = env.tx(lambda q: q.list_jobs("q"))
    assert [j.id for j in listed] == sent[::-1]


def test_send_many_then_send_list_newest_first(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))

    def batches(q: Any) -> None:
        q.send_many("q", [{"data": {"n": n}} for n in range(5)])
        q.send("q", {"n": 5})
        q.send_many("q", [{"data": {"n": n}} for n in range(6, 9)])

    env.tx(batches)
    listed = env.tx(lambda q: q.list_jobs("q"))
    assert [j.data["n"] for j in listed] == list(range(8, -1, -1))
    # And a worker takes them first in, first out.
    fetched = env.tx(lambda q: q.fetch("q", batch_size=9))
    assert [j.data["n"] for j in fetched] == list(range(9))


def test_fresh_ids_are_version_7_and_ascend_across_calls() -> None:
    ids = [i for _ in range(50) for i in _fresh_ids(7)[0]] + _fresh_ids(5000)[0]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)


def test_separate_sends_list_newest_first_at_schema_46(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    sent = env46.tx(lambda q: [q.send("q", {"n": n}) for n in range(6)])
    assert [j.id for j in env46.tx(lambda q: q.list_jobs("q"))] == sent[::-1]
    assert [j.id for j in env46.tx(lambda q: q.find_jobs("q")).jobs] == sent[::-1]
