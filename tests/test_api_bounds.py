"""The HTTP API's bounds (alkstore_sa.api, docs/how-to/http-api.md): ``max_batch`` caps
``fetch``'s ``batch_size`` and every list a request gives, and only those (not the
entries of a job's data); a value the database refuses is the caller's 400, not a 503
"try again"; ``per_job`` outcomes match items by id value; an option that clashes with a
parameter (``self`` included) is a 400; a token that can never match is refused by
``create_app``, and a short one warned about."""

from __future__ import annotations

import datetime as dt
import uuid
import warnings
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from starlette.requests import Request
from test_api import TOKEN, client, ok, refused

from alkstore_sa import InvalidOptionsError
from alkstore_sa.api import create_app
from alkstore_sa.api._app import _error


def states(engine: Engine, schema: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT state, count(*) FROM "{schema}".job GROUP BY state'))
        return {str(state): int(n) for state, n in rows}


# ------------------------------------------------------------------ max_batch


def test_fetch_claims_at_most_max_batch_jobs(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, max_batch=5)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    ok(api.post("/api/send_many", json={"name": "q", "jobs": [{"data": n} for n in range(5)]}))
    ok(api.post("/api/send_many", json={"name": "q", "jobs": [{"data": n} for n in range(5)]}))
    body = refused(
        api.post("/api/fetch", json={"name": "q", "batch_size": 3000}), 413, "BatchTooLarge"
    )
    assert body["error"]["option"] == "batch_size" and "batch limit of 5" in body["detail"]
    assert states(engine, schema46) == {"created": 10}  # nothing claimed
    assert len(ok(api.post("/api/fetch", json={"name": "q", "batch_size": 5}))) == 5
    assert states(engine, schema46) == {"created": 5, "active": 5}


def test_the_entries_of_a_job_s_data_are_not_a_batch(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46, max_batch=5)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    data = {f"k{n}": n for n in range(50)}
    job_id = ok(api.post("/api/send", json={"name": "q", "data": data}))
    ok(api.post("/api/send_many", json={"name": "q", "jobs": [{"data": data}] * 5}))
    [job] = ok(api.post("/api/fetch", json={"name": "q"}))
    ok(api.post("/api/complete", json={"name": "q", "jobs": job["id"], "output": data}))
    got = ok(api.get("/api/get_job", params={"name": "q", "id": job_id}))
    assert got["data"] == data
    # Lists are still counted: in a body and in a query string.
    refused(
        api.post("/api/send_many", json={"name": "q", "jobs": [{"data": 1}] * 6}),
        413,
        "BatchTooLarge",
    )
    names: Any = [("names", f"q{n}") for n in range(6)]
    refused(api.get("/api/get_queues", params=names), 413, "BatchTooLarge")
    assert states(engine, schema46) == {"created": 5, "completed": 1}


# ------------------------------------------------------------------ data errors


def test_a_value_the_database_refuses_is_a_400(engine: Engine) -> None:
    with engine.connect() as conn, pytest.raises(DBAPIError) as caught:
        conn.execute(text("SELECT 1 / 0"))
    request = Request({"type": "http", "method": "POST", "path": "/api/send", "headers": []})
    response = _error(request, caught.value)
    assert response.status_code == 400
    body = bytes(response.body).decode()
    assert '"title":"DataError"' in body and "division by zero" in body
    assert "SELECT" not in body and "Traceback" not in body


@pytest.mark.parametrize(
    "offset", ["+16:00", "-16:00", "+23:59", "+01:00:00.500000", "-00:00:00.000001", "+05:30"]
)
def test_a_fence_at_any_offset_settles_over_http(
    engine: Engine, schema46: str, offset: str
) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    job_id = ok(api.post("/api/send", json={"name": "q"}))
    [job] = ok(api.post("/api/fetch", json={"name": "q"}))
    started = dt.datetime.fromisoformat(job["started_on"])
    hours, _, rest = offset[1:].partition(":")
    minutes, _, seconds = rest.partition(":")
    shift = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds or 0))
    at = started.astimezone(dt.timezone(shift if offset[0] == "+" else -shift))
    item = {"id": job_id, "started_on": at.isoformat(), "output": 1}
    done = ok(api.post("/api/complete_many", json={"name": "q", "items": [item]}))
    assert done["affected"] == [job_id]


def test_a_fence_outside_the_utc_range_is_a_400_naming_it(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    job_id = ok(api.post("/api/send", json={"name": "q"}))
    ok(api.post("/api/fetch", json={"name": "q"}))
    for when in ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+16:00"):
        item = {"id": job_id, "started_on": when}
        body = refused(
            api.post("/api/complete_many", json={"name": "q", "items": [item]}),
            400,
            "InvalidOptionsError",
        )
        assert body["error"]["option"] == "started_on" and "outside" in body["detail"]
    assert states(engine, schema46) == {"active": 1}


# ------------------------------------------------------------------ per_job


def test_per_job_outcomes_match_items_by_id_value(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    for name in ("q", "other"):
        ok(api.post("/api/create_queue", json={"name": name}))
    done_id = ok(api.post("/api/send", json={"name": "q"}))
    ok(api.post("/api/fetch", json={"name": "q"}))
    ok(api.post("/api/complete", json={"name": "q", "jobs": done_id}))
    live_id = ok(api.post("/api/send", json={"name": "q"}))
    [live] = ok(api.post("/api/fetch", json={"name": "q"}))
    elsewhere = ok(api.post("/api/send", json={"name": "other"}))
    unknown = str(uuid.uuid4())
    items: list[Any] = [
        {"id": live_id, "started_on": live["started_on"]},
        {"id": done_id.upper()},  # the same id, spelt otherwise
        {"id": elsewhere},
        {"id": unknown},
    ]
    result = ok(api.post("/api/complete_many", json={"name": "q", "items": items, "per_job": True}))
    seen = [(o["id"], o["settled"], o["reason"], o["state"]) for o in result["outcomes"]]
    assert seen == [
        (live_id, True, None, "completed"),
        (done_id, False, "not_active", "completed"),
        (elsewhere, False, "wrong_queue", "created"),
        (unknown, False, "not_found", None),
    ]


# ------------------------------------------------------------------ clashes


def test_options_that_clash_with_parameters_are_a_400(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    ok(api.post("/api/create_queue", json={"name": "q"}))
    for operation, args in (
        ("send", {"name": "q", "options": {"self": 1}}),
        ("create_queue", {"name": "q2", "options": {"self": None}}),
        ("send", {"name": "q", "options": {"data": 1}}),
        ("send_after", {"name": "q", "data": None, "start_after": 5, "options": {"startAfter": 5}}),
    ):
        body = refused(api.post(f"/api/{operation}", json=args), 400, "InvalidOptionsError")
        assert "is not an option of" in body["detail"], body
    assert states(engine, schema46) == {}
    assert ok(api.get("/api/get_queue", params={"name": "q2"})) is None


# ------------------------------------------------------------------ tokens


@pytest.mark.parametrize(
    "token",
    [
        " " + TOKEN,
        TOKEN + "\n",
        "t\u00f6ken-" + "x" * 20,
        "token-\u2603-" + "x" * 20,
        "token\x00" + "x" * 20,
        "token\x7f" + "x" * 20,
    ],
    ids=["leading-space", "trailing-newline", "latin1", "snowman", "nul", "del"],
)
def test_a_token_that_can_never_match_is_refused(engine: Engine, token: str) -> None:
    with pytest.raises(InvalidOptionsError, match="token 2") as caught:
        create_app(engine, auth=[TOKEN, token])
    assert caught.value.option == "auth"
    assert token.strip() not in str(caught.value)  # a token is a secret: never shown


def test_a_short_token_is_warned_about_and_still_works(engine: Engine, schema46: str) -> None:
    with pytest.warns(UserWarning, match="token 1 has 1 character") as caught:
        app = create_app(engine, schemas=[schema46], auth=["x"])
    assert caught[0].filename == __file__  # pointed at the caller
    with pytest.warns(UserWarning, match="15 characters"):
        create_app(engine, schemas=[schema46], auth=["y" * 15])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_app(engine, schemas=[schema46], auth=["z" * 16, TOKEN])
    from starlette.testclient import TestClient

    api = TestClient(app, base_url="http://127.0.0.1")
    ok(api.get("/api/get_queues", headers={"authorization": "Bearer x"}))
    refused(api.get("/api/get_queues", headers={"authorization": "Bearer y"}), 401, "Unauthorized")
