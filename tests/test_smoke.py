from __future__ import annotations

from typing import Any


def test_sent_job_is_fetched_completed_and_read_back(env: Any) -> None:
    env.tx(lambda q: q.create_queue("emails"))
    job_id = env.tx(lambda q: q.send("emails", {"to": "a@example.com"}))
    [job] = env.tx(lambda q: q.fetch("emails"))
    assert job.id == job_id and job.data == {"to": "a@example.com"}
    env.tx(lambda q: q.complete("emails", job.id, {"sent": True}))
    stored = env.tx(lambda q: q.get_job("emails", job_id))
    assert stored.state == "completed" and stored.output == {"sent": True}
