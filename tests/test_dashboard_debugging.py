"""The dashboard shows a failure, a queue's settings and a problem the way people
debug them: a readable traceback, options in units, the reason a row is marked."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from alkstore_sa import QueueService
from alkstore_sa.dashboard import create_app

LOCAL = "http://127.0.0.1"

STACK = (
    "Traceback (most recent call last):\n"
    '  File "/venv/lib/python3.12/site-packages/alkstore_sa/worker/_attempt.py", line 80, in run\n'
    "    result = handler(job)\n"
    '  File "/venv/lib/python3.12/site-packages/alkstore_sa/worker/_threads.py", line 12, in call\n'
    "    return fn(job)\n"
    '  File "/srv/app/tasks.py", line 7, in charge\n'
    '    raise PaymentError("card <declined>")\n'
    "PaymentError: card <declined>\n"
)


def _client(engine: Engine, schema: str) -> TestClient:
    app = create_app(engine, schemas=[schema])
    return TestClient(app, base_url=LOCAL, headers={"origin": LOCAL})


def _failed_job(engine: Engine, schema: str) -> Any:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("pay", retry_limit=0)
        job_id = q.send("pay", {"n": 1})
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        [job] = q.fetch("pay", 1)
        q.fail("pay", job, {"name": "PaymentError", "message": "card <declined>", "stack": STACK})
    return job_id


def test_job_page_shows_the_traceback_as_text_with_library_frames_collapsed(
    engine: Engine, schema: str
) -> None:
    job_id = _failed_job(engine, schema)
    page = _client(engine, schema).get(f"/s/{schema}/jobs/{job_id}?queue=pay").text
    block = re.search(r'<div id="job-traceback">(.*?)</div>', page, re.S)
    assert block is not None
    traceback = block.group(1)
    # Real line breaks, not the JSON string's \n; the message escaped, not markup.
    assert '  File "/srv/app/tasks.py", line 7, in charge\n' in traceback.replace("&#34;", '"')
    assert "\\n" not in traceback and "card &lt;declined&gt;" in traceback
    library = re.search(
        r'<details class="library-frames"><summary>2 library frames</summary><pre>(.*?)</pre>',
        traceback,
        re.S,
    )
    assert library is not None and "_attempt.py" in library.group(1)
    assert "tasks.py" not in library.group(1)
    assert 'id="job-error"><strong>PaymentError</strong>: card &lt;declined&gt;' in page
    # The attempt history lists the one attempt, its traceback folded the same way.
    attempts = re.search(r'<ol id="attempts" class="attempts">(.*?)</ol>', page, re.S)
    assert attempts is not None
    [item] = re.findall(r'<li data-attempt="(\d+)" data-cause="(\w+)">', attempts.group(1))
    assert item == ("1", "failed")
    assert "<strong>PaymentError</strong>: card &lt;declined&gt;" in attempts.group(1)
    assert '<details class="attempt-traceback"><summary>Traceback</summary>' in attempts.group(1)
    assert "2 library frames" in attempts.group(1)
    assert 'id="attempts-note"' not in page


def test_job_page_lists_every_failed_attempt_as_text_oldest_first(
    engine: Engine, schema: str
) -> None:
    hostile = '<script>alert("x")</script>\u202e'
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("pay", retry_limit=2)
        job_id = q.send("pay", {"n": 1})
    for n in range(3):
        with Session(engine) as session, session.begin():
            q = QueueService(session, schema=schema)
            [job] = q.fetch("pay", 1, ignore_start_after=True)
            q.fail("pay", job, {"name": "Err", "message": f"{hostile} {n}", "stack": f"S{n}"})
    page = _client(engine, schema).get(f"/s/{schema}/jobs/{job_id}?queue=pay").text
    attempts = re.search(r'<ol id="attempts" class="attempts">(.*?)</ol>', page, re.S)
    assert attempts is not None
    numbers = re.findall(r'<li data-attempt="(\d+)"', attempts.group(1))
    assert numbers == ["1", "2", "3"]
    assert "<script>" not in page and "\u202e" not in page
    assert attempts.group(1).count("&lt;script&gt;alert(") == 3
    # The job's attempt reads as the worker's log says it, not as pg-boss's retry_count.
    assert '<span id="job-attempt">attempt 3 of 3</span>' in page
    listing = _client(engine, schema).get(f"/s/{schema}/jobs?queue=pay").text
    assert "<th>attempt</th>" in listing
    assert '<td class="num attempt">3 of 3</td>' in listing


def test_job_page_of_a_job_waiting_to_retry_says_which_attempt_is_next(
    engine: Engine, schema: str
) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("pay", retry_limit=2, retry_delay=60)
        waiting = q.send("pay", {"n": 1})
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        [job] = q.fetch("pay", 1)
        q.fail("pay", job, {"message": "no"})
        fresh = q.send("pay", {"n": 2})
    client = _client(engine, schema)
    page = client.get(f"/s/{schema}/jobs/{waiting}?queue=pay").text
    assert '<span id="job-attempt">attempt 1 of 3 failed, attempt 2 next</span>' in page
    page = client.get(f"/s/{schema}/jobs/{fresh}?queue=pay").text
    assert '<span id="job-attempt">no attempt yet, 3 allowed</span>' in page


def test_job_page_without_recorded_attempts_says_why(engine: Engine, schema: str) -> None:
    job_id = _failed_job(engine, schema)
    with engine.begin() as conn:  # as if Node had failed it: no history rows
        conn.exec_driver_sql(f'DELETE FROM "{schema}".alkstore_job_attempt')
    page = _client(engine, schema).get(f"/s/{schema}/jobs/{job_id}?queue=pay").text
    assert 'id="attempts"' not in page
    assert 'id="attempts-note"' in page and "failed by Node pg-boss" in page


def test_job_page_of_a_completed_job_shows_its_output_as_json(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("pay")
        job_id = q.send("pay", {"n": 1})
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        [job] = q.fetch("pay", 1)
        q.complete("pay", job, {"stack": "not an error"})
    page = _client(engine, schema).get(f"/s/{schema}/jobs/{job_id}?queue=pay").text
    assert 'id="job-traceback"' not in page and '<pre id="job-output">' in page


def test_queue_page_shows_settings_in_units_with_their_meaning(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).create_queue("pay", retry_delay=90)
    page = _client(engine, schema).get(f"/s/{schema}/queues/pay").text
    assert '<dd data-option="retention_seconds">14 days' in page
    assert '<dd data-option="retry_delay">1 min 30 s' in page
    assert '<dd data-option="retry_limit">2 retries (3 attempts)' in page
    assert "how long a finished job is kept before it is deleted" in page
    options = re.search(r'<dl id="queue-options">(.*?)</dl>', page, re.S)
    assert options is not None and "1209600" not in options.group(1)


def test_internal_queue_is_marked_on_the_overview_and_its_page(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).create_queue("__pgboss__send-it")
    client = _client(engine, schema)
    row = re.search(r'<tr data-queue="__pgboss__send-it".*?</tr>', client.get("/").text, re.S)
    assert row is not None and "internal: cron files each due schedule here" in row.group(0)
    page = client.get(f"/s/{schema}/queues/__pgboss__send-it").text
    assert 'id="queue-note"' in page and "internal: cron files" in page


def test_problem_row_says_why(engine: Engine, schema: str) -> None:
    _failed_job(engine, schema)
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("busy", warning_queued=2)
        q.send_many("busy", [{"data": n} for n in range(3)])
    overview = _client(engine, schema).get("/").text
    pay = re.search(r'<tr data-queue="pay".*?</tr>', overview, re.S)
    busy = re.search(r'<tr data-queue="busy".*?</tr>', overview, re.S)
    assert pay is not None and busy is not None
    assert re.search(r'class="problem-reason"[^>]*>[^<]*1 failed job', pay.group(0))
    assert re.search(
        r'class="problem-reason"[^>]*>[^<]*3 queued, over warning_queued 2', busy.group(0)
    )


def test_overview_without_history_says_how_to_turn_it_on(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("pay")
    overview = _client(engine, schema46).get("/").text
    row = re.search(r'<tr data-queue="pay".*?</tr>', overview, re.S)
    assert row is not None and "persist_queue_stats=True" in row.group(0)
