"""The HTTP API (alkstore_sa.api, docs/how-to/http-api.md): the service's operations over
JSON, its OpenAPI document, and every kind of bad request refused with a clear problem."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from openapi_spec_validator import validate
from sqlalchemy import Engine
from starlette.testclient import TestClient
from support.worker import wait_for

from alkstore_sa.api import create_app, openapi_document
from alkstore_sa.api._operations import OPERATIONS

LOCAL = "http://127.0.0.1"
TOKEN = "t0k-" + "x" * 40


def client(engine: Engine, schema: str, **options: Any) -> TestClient:
    return TestClient(create_app(engine, schemas=[schema], **options), base_url=LOCAL)


def ok(response: Any) -> Any:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is True
    return body["result"]


def refused(response: Any, status: int, name: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert (body["title"], body["status"], body["ok"]) == (name, status, False)
    assert body["error"]["name"] == name and body["detail"] == body["error"]["message"]
    # Never a traceback or SQL.
    assert "Traceback" not in response.text and "SELECT" not in response.text
    return body


def test_a_remote_client_sends_fetches_and_completes_a_job(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    queue = ok(api.post("/api/create_queue", json={"name": "mail", "options": {"retry_limit": 1}}))
    assert (queue["name"], queue["retry_limit"]) == ("mail", 1)
    job_id = ok(api.post("/api/send", json={"name": "mail", "data": {"to": "ada"}}))
    [job] = ok(api.post("/api/fetch", json={"name": "mail", "batch_size": 5}))
    assert (job["id"], job["data"], job["state"]) == (job_id, {"to": "ada"}, "active")
    done = ok(api.post("/api/complete", json={"name": "mail", "jobs": job_id, "output": 7}))
    assert done["affected"] == [job_id]
    got = ok(api.get("/api/get_job", params={"name": "mail", "id": job_id}))
    assert (got["state"], got["output"]) == ("completed", {"value": 7})
    page = ok(api.get("/api/find_jobs", params={"name": "mail", "limit": 10}))
    assert [j["id"] for j in page["jobs"]] == [job_id]


def test_failures_and_their_attempts_over_http(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q", "options": {"retry_limit": 0}}))
    job_id = ok(api.post("/api/send", json={"name": "q"}))
    ok(api.post("/api/fetch", json={"name": "q"}))
    failed = ok(api.post("/api/fail", json={"name": "q", "jobs": [job_id], "output": {"e": 1}}))
    assert failed["states"] == {job_id: "failed"}
    [attempt] = ok(api.get("/api/get_job_attempts", params={"name": "q", "id": job_id}))
    assert (attempt["attempt"], attempt["cause"], attempt["error"]) == (1, "failed", {"e": 1})


def test_pgboss_names_reach_the_same_operations_and_options(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/createQueue", json={"name": "q", "options": {"retryLimit": 4}}))
    job_id = ok(
        api.post(
            "/api/sendAfter",
            json={"name": "q", "data": {"n": 1}, "start_after": 3600, "options": {"priority": 3}},
        )
    )
    got = ok(api.get("/api/getJob", params={"name": "q", "id": job_id}))
    assert (got["retry_limit"], got["priority"], got["state"]) == (4, 3, "created")
    assert ok(api.post("/api/fetch", json={"name": "q"})) == []  # deferred an hour


def test_reads_take_lists_integers_and_booleans_from_the_query(
    engine: Engine, schema46: str
) -> None:
    api = client(engine, schema46)
    for name in ("a", "b", "c"):
        ok(api.post("/api/create_queue", json={"name": name}))
    ok(api.post("/api/send_many", json={"name": "a", "jobs": [{"data": n} for n in range(3)]}))
    queues = ok(api.get("/api/get_queues", params=[("names", "a"), ("names", "b")]))
    assert sorted(q["name"] for q in queues) == ["a", "b"]
    counts = ok(api.get("/api/count_jobs", params=[("names", "a")]))
    assert counts[0]["counts"]["created"] == 3
    refused(
        api.get("/api/find_jobs", params={"name": "a", "limit": "ten"}), 400, "InvalidOptionsError"
    )


def test_one_request_is_one_transaction(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    # The flow's second job names an unknown ref: nothing of the flow is written.
    bad = api.post(
        "/api/flow",
        json={
            "jobs": [
                {"ref": "a", "name": "q"},
                {"ref": "b", "name": "q", "depends_on": ["nope"]},
            ]
        },
    )
    refused(bad, 400, "InvalidOptionsError")
    assert ok(api.get("/api/count_jobs", params={"names": "q"}))[0]["counts"]["created"] == 0


def test_bad_input_gets_a_clear_problem_each(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, max_batch=10, max_body_bytes=4096)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    # Wrong types, named by the service.
    body = refused(
        api.post("/api/send", json={"name": "q", "options": {"priority": "high"}}),
        400,
        "InvalidOptionsError",
    )
    assert body["error"]["option"] == "priority"
    refused(api.post("/api/send", json={"name": 5}), 400, "InvalidNameError")
    refused(api.post("/api/send", json={"name": "q", "retries": 3}), 400, "InvalidOptionsError")
    refused(
        api.post("/api/send", json={"name": "q", "options": {"no_such": 1}}),
        400,
        "InvalidOptionsError",
    )
    refused(api.post("/api/send", json={"data": 1}), 400, "InvalidOptionsError")
    # Oversize: a batch over max_batch, a body over max_body_bytes.
    jobs = [{"data": n} for n in range(11)]
    body = refused(
        api.post("/api/send_many", json={"name": "q", "jobs": jobs}), 413, "BatchTooLarge"
    )
    assert "batch limit of 10" in body["detail"]
    big = {"name": "q", "data": "x" * 5000}
    refused(api.post("/api/send", json=big), 413, "PayloadTooLarge")
    # An unknown queue, operation, schema; the wrong method; not JSON.
    refused(api.post("/api/send", json={"name": "nope"}), 404, "QueueNotFoundError")
    refused(api.post("/api/drop_everything", json={}), 404, "UnknownOperation")
    refused(api.post("/s/other/api/send", json={"name": "q"}), 404, "SchemaNotServed")
    refused(api.get("/api/send", params={"name": "q"}), 405, "MethodNotAllowed")
    refused(api.post("/api/get_job", json={}), 405, "MethodNotAllowed")
    refused(
        api.post("/api/send", content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "InvalidJSON",
    )
    refused(
        api.post("/api/send", content=b"[1]", headers={"content-type": "application/json"}),
        400,
        "InvalidJSON",
    )
    refused(api.post("/api/send", content=b"name=q"), 415, "UnsupportedMediaType")
    nan = b'{"name": "q", "data": NaN}'
    refused(
        api.post("/api/send", content=nan, headers={"content-type": "application/json"}),
        400,
        "InvalidJSON",
    )
    # Nothing was written by any of them.
    assert ok(api.get("/api/count_jobs", params={"names": "q"}))[0]["counts"]["created"] == 0


def test_tokens_are_required_when_set_and_compared_whole(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, auth=[TOKEN, "another-token"])
    ok(
        api.post(
            "/api/create_queue", json={"name": "q"}, headers={"authorization": f"Bearer {TOKEN}"}
        )
    )
    ok(api.get("/api/get_queues", headers={"authorization": "Bearer another-token"}))
    for header in (
        {},
        {"authorization": "Bearer"},
        {"authorization": f"Bearer {TOKEN[:-1]}"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": f"Basic {TOKEN}"},
    ):
        response = api.post("/api/send", json={"name": "q"}, headers=header)
        refused(response, 401, "Unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    # With a token, any Host name (the proxy in front decides the names).
    remote = TestClient(api.app, base_url="http://queue.internal")
    ok(remote.get("/api/get_queues", headers={"authorization": f"Bearer {TOKEN}"}))


def test_a_token_check_of_the_application(engine: Engine, schema46: str) -> None:
    seen: list[str] = []

    async def check(token: str) -> bool:
        seen.append(token)
        return token == "let-me-in"

    api = client(engine, schema46, auth=check)
    ok(api.get("/api/get_queues", headers={"authorization": "Bearer let-me-in"}))
    refused(api.get("/api/get_queues", headers={"authorization": "Bearer no"}), 401, "Unauthorized")
    assert seen == ["let-me-in", "no"]


def test_without_tokens_only_loopback_answers_and_no_other_site(
    engine: Engine, schema46: str
) -> None:
    api = client(engine, schema46)
    # DNS rebinding: another site's name resolved to 127.0.0.1 sends that name.
    rebound = TestClient(api.app, base_url="http://evil.example")
    refused(rebound.get("/api/get_queues"), 403, "Forbidden")
    refused(rebound.get("/openapi.json"), 403, "Forbidden")
    refused(rebound.post("/api/create_queue", json={"name": "q"}), 403, "Forbidden")
    # A page on another site posting to 127.0.0.1.
    for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
        refused(
            api.post("/api/create_queue", json={"name": "q"}, headers=headers), 403, "Forbidden"
        )
    assert ok(api.get("/api/get_queues")) == []
    # A client at a non-loopback address.
    app = api.app

    async def from_afar(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "client": ("10.1.2.3", 4444)}, receive, send)

    far = TestClient(from_afar, base_url=LOCAL)
    refused(far.get("/api/get_queues"), 403, "Forbidden")
    # A name allowed for a tunnel does not open the API to other machines without tokens.
    tunnel = create_app(engine, schemas=[schema46], allowed_hosts=["queue.tunnel"])

    async def through_tunnel(scope: Any, receive: Any, send: Any) -> None:
        await tunnel({**scope, "client": ("10.1.2.3", 4444)}, receive, send)

    refused(
        TestClient(through_tunnel, base_url="http://queue.tunnel").get("/api/get_queues"),
        403,
        "Forbidden",
    )
    assert ok(TestClient(tunnel, base_url="http://queue.tunnel").get("/api/get_queues")) == []


def test_read_only_serves_reads_and_refuses_every_write(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, read_only=True)
    assert ok(api.get("/api/get_queues")) == []
    for op in OPERATIONS:
        if not op.reads:
            refused(api.post(op.path, json={}), 403, "ReadOnly")


def test_a_statement_over_the_timeout_is_a_503_without_sql(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, statement_timeout_ms=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'LOCK TABLE "{schema46}".queue IN ACCESS EXCLUSIVE MODE NOWAIT')
        response = api.get("/api/get_queues")
    refused(response, 503, "StatementTimeout")


def test_the_openapi_document_validates_and_covers_every_operation(
    engine: Engine, schema46: str
) -> None:
    api = client(engine, schema46)
    document = api.get("/openapi.json").json()
    validate(document)
    assert document == json.loads(json.dumps(openapi_document()))
    assert document["openapi"] == "3.1.0"
    ops = {entry["operationId"] for path in document["paths"].values() for entry in path.values()}
    assert ops == {op.name for op in OPERATIONS}
    send = document["paths"]["/api/send"]["post"]["requestBody"]["content"]["application/json"]
    options = send["schema"]["properties"]["options"]["properties"]
    # From the option table: bounds, sizes and help as the service checks them.
    assert (
        options["priority"]["minimum"] == -(2**31) and options["priority"]["maximum"] == 2**31 - 1
    )
    assert options["singleton_key"]["anyOf"][0]["maxLength"] == 2048
    assert options["retry_limit"]["description"]
    get_job = document["paths"]["/api/get_job"]["get"]
    assert [p["name"] for p in get_job["parameters"]] == ["name", "id"]
    assert "Job" in document["components"]["schemas"]
    page = api.get("/docs")
    assert page.status_code == 200 and "<code>POST /api/send</code>" in page.text
    assert "<script" not in page.text and page.headers["content-security-policy"].startswith(
        "default-src 'none'"
    )


def test_bad_arguments_to_create_app_are_refused(engine: Engine) -> None:
    from alkstore_sa import InvalidOptionsError

    with pytest.raises(InvalidOptionsError, match="auth"):
        create_app(engine, auth=[])
    with pytest.raises(InvalidOptionsError, match="auth"):
        create_app(engine, auth="one-token")
    with pytest.raises(InvalidOptionsError, match="max_batch"):
        create_app(engine, max_batch=0)
    with pytest.raises(InvalidOptionsError, match="schemas"):
        create_app(engine, schemas=[])


def test_ids_in_answers_are_text_and_unknown_ids_are_refused(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    assert ok(api.get("/api/get_job", params={"name": "q", "id": str(uuid.uuid4())})) is None
    refused(
        api.get("/api/get_job", params={"name": "q", "id": "not-a-uuid"}),
        400,
        "InvalidOptionsError",
    )


def test_supervise_runs_supervision_while_the_app_runs(engine: Engine, schema46: str) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    app = create_app(engine, schemas=[schema46], supervise=True)

    def monitored() -> bool:
        with Session(engine) as session:
            info = QueueService(session, schema=schema46).get_queue("q")
            return info is not None and info.monitor_on is not None

    assert not monitored()
    with TestClient(app, base_url=LOCAL):  # the lifespan starts and stops the supervisor
        wait_for(monitored, timeout=20)
    # Without supervise, the same app runs none.
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("r")
    with TestClient(create_app(engine, schemas=[schema46]), base_url=LOCAL) as api:
        ok(api.get("/api/get_queues"))
    with Session(engine) as session:
        info = QueueService(session, schema=schema46).get_queue("r")
    assert info is not None and info.monitor_on is None


@pytest.mark.subprocess
def test_alkstore_api_serves_until_interrupted_and_refuses_a_public_bind_without_tokens(
    database_url: str, schema46: str
) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request

    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    cli = [sys.executable, "-m", "alkstore_sa.cli", "api", "--database-url", database_url]
    refused_bind = subprocess.run(
        [*cli, "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused_bind.returncode == 2
    assert "ALKSTORE_API_TOKENS" in refused_bind.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [*cli, "--schema", schema46, "--port", str(port)],
        env={**env, "ALKSTORE_API_TOKENS": f"{TOKEN}, second-token-0123456789"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert f"http://127.0.0.1:{port}/api" in line
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/get_queues",
            headers={"Authorization": "Bearer second-token-0123456789"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read()) == {"ok": True, "result": []}
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 130  # interrupted, as every command says it


def test_a_remote_worker_settles_fenced_on_the_attempt_it_fetched(
    engine: Engine, schema46: str
) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q", "options": {"retry_limit": 3}}))
    job_id = ok(api.post("/api/send", json={"name": "q"}))
    [stale] = ok(api.post("/api/fetch", json={"name": "q"}))
    # Its lease lapsed and another worker took the job again: a newer attempt.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE \"{schema46}\".job SET state = 'retry', start_after = now() - interval '1 s'"
        )
    [fresh] = ok(api.post("/api/fetch", json={"name": "q"}))
    assert fresh["started_on"] != stale["started_on"]
    late = {"id": job_id, "started_on": stale["started_on"], "output": {"by": "stale"}}
    refused_item = ok(
        api.post("/api/complete_many", json={"name": "q", "items": [late], "per_job": True})
    )
    assert refused_item["affected"] == [] and refused_item["outcomes"][0]["settled"] is False
    current = {"id": job_id, "started_on": fresh["started_on"], "output": {"by": "fresh"}}
    done = ok(api.post("/api/complete_many", json={"name": "q", "items": [current]}))
    assert done["affected"] == [job_id]
    got = ok(api.get("/api/get_job", params={"name": "q", "id": job_id}))
    assert got["output"] == {"by": "fresh"}
    # An item that is not {id, output, started_on}, or a time that is not one.
    for item in ({"job": job_id}, {"id": job_id, "started_on": "yesterday"}):
        refused(
            api.post("/api/fail_many", json={"name": "q", "items": [item]}),
            400,
            "InvalidOptionsError",
        )
