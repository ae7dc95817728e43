"""The ``alkstore`` admin commands: db, queue, send, jobs, schedule.

Every command runs in-process through :func:`alkstore_sa.cli.main`, with the global
options placed after the sub-command (as a user types them). Output is a table or
``key  value`` lines by default and JSON with ``--json``; errors exit non-zero with
one line on stderr.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.schemas import random_schema, schema_exists, throwaway

from alkstore_sa import InvalidOptionsError, QueueNotFoundError, QueueService, migrate
from alkstore_sa.cli import main


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def data(self) -> Any:
        return json.loads(self.out)


@dataclass
class Cli:
    """``alkstore`` against one schema of the test database."""

    capsys: pytest.CaptureFixture[str]
    database_url: str
    schema: str
    engine: Engine

    def __call__(self, *argv: str, json_output: bool = False) -> Ran:
        args = [*argv, "--database-url", self.database_url, "--schema", self.schema]
        if json_output:
            args.append("--json")
        self.capsys.readouterr()
        code = main(args)
        captured = self.capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    def json(self, *argv: str) -> Any:
        ran = self(*argv, json_output=True)
        assert ran.code == 0, ran.err
        return ran.data

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(text(statement.replace("{s}", f'"{self.schema}"')), params)
            return list(result.all()) if result.returns_rows else []

    def service(self, fn: Any) -> Any:
        with Session(self.engine) as session, session.begin():
            return fn(QueueService(session, schema=self.schema))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], database_url: str, schema: str, engine: Engine) -> Cli:
    return Cli(capsys, database_url, schema, engine)


def _one_line_error(ran: Ran, *fragments: str) -> None:
    assert ran.code != 0
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alkstore: error: "), ran.err
    for fragment in fragments:
        assert fragment in lines[0]


# --------------------------------------------------------------------- db


def test_db_upgrade_installs_46_and_current_reports_the_revision(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        assert main(["db", "upgrade", "--database-url", database_url, "--schema", name]) == 0
        capsys.readouterr()
        assert (
            main(["db", "current", "--json", "--database-url", database_url, "--schema", name]) == 0
        )
        found = json.loads(capsys.readouterr().out)
        assert (found["schema"], found["revision"], found["version"]) == (name, "alkstore_0046", 46)


def test_db_upgrade_fails_when_the_recorded_schema_was_moved_to_another_version(cli: Cli) -> None:
    cli.sql("UPDATE {s}.version SET version = 25")
    args = ("db", "upgrade", "--schema-version", "26")
    _one_line_error(cli(*args), "version 25", "start Node pg-boss 11.1.x once")
    # On the way to the default (46), the first revision after 26 refuses it as well.
    _one_line_error(cli("db", "upgrade"), "version 25", "Nothing was changed")


def test_db_check_reports_version_26(cli: Cli) -> None:
    assert cli.json("db", "check") == {
        "schema": cli.schema,
        "version": 26,
        "status": "ok",
        "findings": [],
        "closest_version": None,
        "profile": "postgres",
    }


def test_db_check_on_a_missing_schema_says_how_to_install(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    name = random_schema()
    code = main(["db", "check", "--database-url", database_url, "--schema", name])
    _one_line_error(Ran(code, *capsys.readouterr()), "not installed", "alkstore db upgrade")


def test_db_check_on_another_version_names_it(cli: Cli) -> None:
    cli.sql("UPDATE {s}.version SET version = 24")
    _one_line_error(cli("db", "check"), "version 24", "no upgrade path")


def test_db_downgrade_removes_the_schema(cli: Cli) -> None:
    assert cli.json("db", "downgrade") == {
        "schema": cli.schema,
        "status": "downgraded",
        "revision": None,
        "message": "removed the queue schema objects",
    }
    assert not schema_exists(cli.engine, cli.schema)


def test_db_sql_prints_the_script_without_a_database(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALKSTORE_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["db", "sql", "--schema", "Jobs_Here"]) == 0
    script = capsys.readouterr().out
    assert 'CREATE TABLE "Jobs_Here".job_common' in script
    assert script.rstrip().endswith("COMMIT;")


def test_db_upgrade_reads_url_and_schema_from_the_environment(
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = random_schema()
    monkeypatch.setenv("ALKSTORE_DATABASE_URL", database_url)
    monkeypatch.setenv("ALKSTORE_SCHEMA", name)
    with throwaway(engine, name):
        assert main(["db", "upgrade"]) == 0
        assert migrate.check(engine, name) == 46


# --------------------------------------------------------------------- errors


def test_missing_database_url_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALKSTORE_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    code = main(["queue", "list"])
    _one_line_error(Ran(code, *capsys.readouterr()), "no database", "ALKSTORE_DATABASE_URL")


def test_bad_database_url_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["queue", "list", "--database-url", "not a url"])
    _one_line_error(Ran(code, *capsys.readouterr()), "bad database URL")


def test_unreachable_database_is_a_one_line_error_naming_it_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://nobody:s3cret@127.0.0.1:1/none"
    code = main(["queue", "list", "--database-url", url])
    ran = Ran(code, *capsys.readouterr())
    _one_line_error(ran, "cannot connect to database 'none' on 127.0.0.1:1", "refused")
    assert ran.code == 1
    assert "s3cret" not in ran.err


def test_schema_not_installed_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    name = random_schema()
    code = main(["queue", "list", "--database-url", database_url, "--schema", name])
    _one_line_error(Ran(code, *capsys.readouterr()), repr(name), "not installed")


def test_invalid_schema_name_is_a_one_line_error(cli: Cli, database_url: str) -> None:
    cli.capsys.readouterr()
    code = main(["queue", "list", "--database-url", database_url, "--schema", "no-dash"])
    _one_line_error(Ran(code, *cli.capsys.readouterr()), "schema")


# --------------------------------------------------------------------- queue


def test_queue_create_applies_the_options_and_prints_the_queue(cli: Cli) -> None:
    assert cli("queue", "create", "dlq").code == 0
    info = cli.json(
        "queue", "create", "orders", "--policy", "short", "--retry-limit", "5",
        "--retry-backoff", "--retry-delay-max", "60", "--dead-letter", "dlq",
        "--expire-seconds", "30",
    )  # fmt: skip
    assert {k: info[k] for k in ("name", "policy", "retry_limit", "retry_backoff")} == {
        "name": "orders",
        "policy": "short",
        "retry_limit": 5,
        "retry_backoff": True,
    }
    assert (info["retry_delay_max"], info["dead_letter"], info["expire_seconds"]) == (60, "dlq", 30)


def test_queue_create_with_partition_gives_a_dedicated_table(cli: Cli) -> None:
    info = cli.json("queue", "create", "big", "--partition")
    assert info["partition"] is True and info["table_name"].startswith("j")


def test_queue_create_of_an_existing_queue_leaves_it_unchanged_and_says_so(
    cli: Cli, caplog: pytest.LogCaptureFixture
) -> None:
    cli.json("queue", "create", "q", "--retry-limit", "1")
    ran = cli("queue", "create", "q", "--retry-limit", "9", json_output=True)
    assert ran.code == 0 and ran.data["retry_limit"] == 1
    # In-process, pytest's handler takes the record that a shell sees as one
    # `alkstore: warning:` line (log_to_stderr; tests/test_cli_unix.py runs the CLI).
    [record] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "retry_limit 1 -> 9" in record.getMessage()
    assert "alkstore queue ensure" in record.getMessage()


def test_queue_ensure_creates_or_makes_the_queue_match(cli: Cli) -> None:
    assert cli.json("queue", "ensure", "q", "--retry-limit", "1")["retry_limit"] == 1
    changed = cli.json("queue", "ensure", "q", "--retry-limit", "9", "--expire-seconds", "60")
    assert (changed["retry_limit"], changed["expire_seconds"]) == (9, 60)
    _one_line_error(cli("queue", "ensure", "q", "--policy", "short"), "cannot be changed")
    assert cli.json("queue", "show", "q")["queue"]["policy"] == "standard"


def test_queue_create_with_fail_if_exists_refuses_an_existing_queue(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    _one_line_error(cli("queue", "create", "q", "--fail-if-exists"), "already exists")


def test_queue_create_with_a_bad_option_names_it_and_writes_nothing(cli: Cli) -> None:
    _one_line_error(cli("queue", "create", "q", "--expire-seconds", "0"), "expire_seconds")
    assert cli.sql("SELECT count(*) FROM {s}.queue") == [(0,)]


def _table(out: str) -> tuple[str, list[str], list[str]]:
    """``queue list`` output: its header, its rows, and the lines after the table."""
    table, _, after = out.strip().partition("\n\n")
    header, *rows = table.splitlines()
    return header, rows, after.splitlines()


def test_queue_list_prints_a_table(cli: Cli) -> None:
    cli.json("queue", "create", "alpha", "--policy", "stately")
    cli.json("queue", "create", "beta")
    ran = cli("queue", "list")
    header, rows, _ = _table(ran.out)
    assert header.split()[:3] == ["NAME", "POLICY", "PARTITION"]
    assert [r.split()[:2] for r in rows] == [["alpha", "stately"], ["beta", "standard"]]


def test_queue_list_says_its_counts_are_cached_and_live_counts_now(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    job_id = cli.service(lambda q: q.send("q"))
    cli.service(lambda q: q.supervise("q", force=True))  # caches the counters: one queued
    [job] = cli.service(lambda q: q.fetch("q"))
    cli.service(lambda q: q.complete("q", job))
    assert job.id == job_id

    header, rows, note = _table(cli("queue", "list").out)
    [row] = [r for r in rows if r.split()[0] == "q"]  # (the pass made __pgboss__send-it)
    cells = dict(zip(header.lower().split(), row.split(), strict=False))
    # The completed job is still counted as queued: the counter is as cached, and says so.
    assert (cells["queued_count"], cells["total_count"]) == ("1", "1")
    assert re.search(r"\bCOUNTED\b", header) and re.search(r"\d+ (ms|s) ago", row)
    assert note == [
        "counts: cached counters, refreshed by a running supervisor (every 60 s by default), "
        "COUNTED says when; `alkstore queue list --live` counts the job table now"
    ]

    header, rows, note = _table(cli("queue", "list", "--live").out)
    [row] = [r for r in rows if r.split()[0] == "q"]
    cells = dict(zip(header.lower().split(), row.split(), strict=False))
    assert (cells["queued_count"], cells["active_count"], cells["total_count"]) == ("0", "0", "1")
    assert cells["counted"] == "now"
    assert note == ["counts: live, counted in the job table now"]
    [live] = [i for i in cli.json("queue", "list", "--live") if i["name"] == "q"]
    [cached] = [i for i in cli.json("queue", "list") if i["name"] == "q"]
    assert (live["queued_count"], cached["queued_count"]) == (0, 1)


def test_queue_list_of_counters_never_cached_says_never(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    header, [row], _ = _table(cli("queue", "list").out)
    assert row[header.index("COUNTED") :].split()[0] == "never"


def test_queue_list_json_lists_every_field(cli: Cli) -> None:
    cli.json("queue", "create", "alpha")
    [queue] = cli.json("queue", "list")
    assert queue["name"] == "alpha" and "created_on" in queue and "deletion_seconds" in queue


def test_queue_list_of_no_queues_says_none(cli: Cli) -> None:
    assert cli("queue", "list").out.strip() == "(none)"


def test_queue_list_says_what_an_internal_queue_is(cli: Cli) -> None:
    cli.json("queue", "create", "__pgboss__send-it")
    cli.json("queue", "create", "orders")
    rows = {r.split()[0]: r for r in _table(cli("queue", "list").out)[1]}
    assert "internal: cron files each due schedule here" in rows["__pgboss__send-it"]
    assert rows["orders"].rstrip().endswith("-")


def test_queue_show_gives_settings_in_plain_units_counts_and_schedules(cli: Cli) -> None:
    cli.json("queue", "create", "dlq")
    cli.json(
        "queue", "create", "payments", "--retry-limit", "2", "--dead-letter", "dlq",
        "--expire-seconds", "900", "--retention-seconds", "1209600",
    )  # fmt: skip
    cli.json("send", "payments", "--data", '{"n": 1}')
    cli.json("schedule", "add", "payments", "*/5 * * * *", "--key", "nightly")
    ran = cli("queue", "show", "payments")
    assert ran.code == 0, ran.err
    lines = {line.split()[0]: line for line in ran.out.splitlines() if line.strip()}
    assert "2 retries (3 attempts)" in lines["retry_limit"]
    assert "14 days" in lines["retention_seconds"] and "1209600" not in ran.out
    assert "15 min" in lines["expire_seconds"]
    assert "dlq" in lines["dead_letter"]
    assert "created 1" in ran.out and "failed 0" in ran.out
    assert "nightly" in lines and "*/5 * * * *" in lines["nightly"]
    shown = cli.json("queue", "show", "payments")
    assert shown["queue"]["retention_seconds"] == 1_209_600
    assert shown["counts"]["counts"]["created"] == 1
    assert [s["key"] for s in shown["schedules"]] == ["nightly"]


def test_queue_show_of_an_unknown_queue_is_a_one_line_error(cli: Cli) -> None:
    _one_line_error(cli("queue", "show", "nope"), "'nope' does not exist")


# ------------------------------------------------------------ parser rules


def test_options_are_never_abbreviated_and_a_near_miss_is_suggested(cli: Cli) -> None:
    cli.json("queue", "create", "invoices")
    ran = cli("send", "invoices", "--prio", "5")
    assert ran.code == 2
    _one_line_error(ran, "unrecognized option '--prio'", "did you mean '--priority'?")
    assert cli.sql("SELECT count(*) FROM {s}.job") == [(0,)]


def test_a_misspelt_command_or_choice_gets_a_suggestion(cli: Cli) -> None:
    _one_line_error(cli("queu", "list"), "invalid choice: 'queu'", "did you mean 'queue'?")
    _one_line_error(cli("queue", "lst"), "did you mean 'list'?")
    _one_line_error(cli("jobs", "list", "q", "--state", "actve"), "did you mean 'active'?")
    far = cli("queue", "zzzz")
    _one_line_error(far, "choose from")
    assert "did you mean" not in far.err


def test_queue_subscriptions_lists_events_of_all_or_one_queue(cli: Cli) -> None:
    cli.json("queue", "create", "alpha")
    cli.json("queue", "create", "beta")
    cli.service(lambda q: (q.subscribe("paid", "beta"), q.subscribe("paid", "alpha")))
    header, *rows = cli("queue", "subscriptions").out.strip().splitlines()
    assert header.split() == ["EVENT", "NAME", "CREATED_ON"]
    assert [r.split()[:2] for r in rows] == [["paid", "alpha"], ["paid", "beta"]]
    [only] = cli.json("queue", "subscriptions", "beta", "--event", "paid")
    assert (only["event"], only["name"]) == ("paid", "beta")
    assert cli("queue", "subscriptions", "--event", "shipped").out.strip() == "(none)"


def test_queue_stats_counts_live_jobs(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    cli.json("send", "q")
    cli.json("send", "q", "--start-after", "3600")
    stats = cli.json("queue", "stats", "q")
    assert (stats["queued_count"], stats["deferred_count"], stats["total_count"]) == (2, 1, 2)


def test_queue_stats_without_a_name_covers_every_queue(cli: Cli) -> None:
    cli.json("queue", "create", "a")
    cli.json("queue", "create", "b")
    cli.json("send", "b")
    rows = cli.json("queue", "stats")
    assert [(r["name"], r["total_count"]) for r in rows] == [("a", 0), ("b", 1)]


def test_queue_stats_of_an_unknown_queue_is_an_error(cli: Cli) -> None:
    _one_line_error(cli("queue", "stats", "nope"), "'nope' does not exist")


def test_queue_update_changes_options(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    assert cli.json("queue", "update", "q", "--retry-limit", "7")["retry_limit"] == 7


def test_queue_update_without_options_is_an_error(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    _one_line_error(cli("queue", "update", "q"), "nothing to update")


def test_queue_delete_removes_the_queue_and_its_jobs(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    cli.json("send", "q")
    assert cli.json("queue", "delete", "q") == {"name": "q", "status": "deleted"}
    assert cli.sql("SELECT (SELECT count(*) FROM {s}.queue), (SELECT count(*) FROM {s}.job)") == [
        (0, 0)
    ]


def test_queue_delete_of_an_unknown_queue_is_an_error(cli: Cli) -> None:
    _one_line_error(cli("queue", "delete", "nope"), "'nope' does not exist")


# --------------------------------------------------------------------- send


def test_send_enqueues_the_job_and_prints_its_id(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    ran = cli(
        "send", "q", "--data", '{"order": 42}', "--priority", "5", "--singleton-key", "k",
        "--retry-limit", "4",
    )  # fmt: skip
    assert ran.code == 0
    job_id = uuid.UUID(ran.out.strip())
    assert cli.sql(
        "SELECT data, priority, singleton_key, retry_limit FROM {s}.job WHERE id = :i", i=job_id
    ) == [({"order": 42}, 5, "k", 4)]


def test_send_with_start_after_defers_the_job(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    job_id = cli.json("send", "q", "--start-after", "600")["id"]
    [(delay,)] = cli.sql(
        "SELECT extract(epoch FROM start_after - created_on) FROM {s}.job WHERE id = :i", i=job_id
    )
    assert 599 <= float(delay) <= 601


def test_send_refused_by_the_queue_policy_exits_3(cli: Cli) -> None:
    cli.json("queue", "create", "q", "--policy", "short")
    cli.json("send", "q", "--singleton-key", "k")
    ran = cli("send", "q", "--singleton-key", "k")
    assert ran.code == 3
    _one_line_error(ran, "not sent")
    assert cli.sql("SELECT count(*) FROM {s}.job") == [(1,)]


def test_send_with_invalid_json_data_is_an_error(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    _one_line_error(cli("send", "q", "--data", "{oops"), "--data is not valid JSON")


def test_send_to_an_unknown_queue_is_an_error(cli: Cli) -> None:
    _one_line_error(cli("send", "nope", "--data", "1"), "'nope' does not exist")


# --------------------------------------------------------------------- jobs


def _jobs(cli: Cli, count: int, queue: str = "q") -> list[str]:
    cli.json("queue", "create", queue)
    return [cli.json("send", queue, "--data", str(n))["id"] for n in range(count)]


def test_jobs_list_shows_the_newest_first(cli: Cli) -> None:
    ids = _jobs(cli, 3)
    assert [j["id"] for j in cli.json("jobs", "list", "q")] == ids[::-1]
    header = cli("jobs", "list", "q").out.splitlines()[0]
    assert header.split()[:3] == ["ID", "STATE", "PRIORITY"]


def test_jobs_list_shows_the_data_cut_to_the_cell_width(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    cli.json("send", "q", "--data", '{"order": 17}')
    cli.json("send", "q", "--data", json.dumps({"note": "x" * 200}))
    header, long_row, short_row = cli("jobs", "list", "q").out.splitlines()
    assert header.split()[-1] == "DATA"
    assert short_row.endswith('{"order": 17}')
    cell = long_row[header.index("DATA") :]
    assert cell.endswith("…") and len(cell) == 60
    assert cli.json("jobs", "list", "q")[0]["data"] == {"note": "x" * 200}


def test_jobs_list_and_get_read_the_attempt_as_the_worker_log_does(cli: Cli) -> None:
    cli.service(lambda q: q.create_queue("q", retry_limit=2, retry_delay=60))
    waiting = cli.service(lambda q: q.send("q", 1))
    [job] = cli.service(lambda q: q.fetch("q"))
    cli.service(lambda q: q.fail("q", job, ValueError("card declined")))
    fresh = cli.service(lambda q: q.send("q", 2))
    header, *rows = cli("jobs", "list", "q").out.splitlines()
    assert "RETRY_COUNT" not in header and "RETRY_LIMIT" not in header
    start = header.index("ATTEMPT")
    attempts = {r.split()[0]: r[start:].split()[:3] for r in rows}
    assert attempts == {str(fresh): ["0", "of", "3"], str(waiting): ["1", "of", "3"]}
    lines = {
        line.split()[0]: line.split(None, 1)[1]
        for line in cli("jobs", "get", "q", str(waiting)).out.splitlines()
    }
    assert lines["attempt"] == "attempt 1 of 3 failed, attempt 2 next"
    assert (lines["retry_count"], lines["retry_limit"]) == ("0", "2")  # pg-boss's fields stay
    # JSON keeps the raw fields only.
    got = cli.json("jobs", "get", "q", str(waiting))
    assert (got["retry_count"], got["retry_limit"]) == (0, 2) and "attempt" not in got
    assert "attempt" not in cli.json("jobs", "list", "q")[0]


def test_jobs_list_filters_by_state_and_limit(cli: Cli) -> None:
    ids = _jobs(cli, 3)
    cli.json("jobs", "cancel", "q", ids[0])
    assert [j["id"] for j in cli.json("jobs", "list", "q", "--state", "cancelled")] == [ids[0]]
    assert len(cli.json("jobs", "list", "q", "--limit", "2")) == 2


def test_jobs_list_of_an_unknown_queue_is_an_error(cli: Cli) -> None:
    _one_line_error(cli("jobs", "list", "nope"), "'nope' does not exist")


def test_jobs_get_prints_every_field(cli: Cli) -> None:
    [job_id] = _jobs(cli, 1)
    job = cli.json("jobs", "get", "q", job_id)
    assert (job["id"], job["state"], job["data"]) == (job_id, "created", 0)
    assert "state" in cli("jobs", "get", "q", job_id).out


def test_jobs_get_of_an_unknown_id_is_an_error(cli: Cli) -> None:
    _jobs(cli, 1)
    missing = str(uuid.uuid4())
    _one_line_error(cli("jobs", "get", "q", missing), missing)


def test_jobs_get_with_a_malformed_id_is_an_error(cli: Cli) -> None:
    _jobs(cli, 1)
    _one_line_error(cli("jobs", "get", "q", "not-a-uuid"), "not a UUID")


def test_jobs_attempts_lists_each_failed_attempt_oldest_first(cli: Cli) -> None:
    cli.service(lambda q: q.create_queue("q", retry_limit=3))
    job_id = cli.service(lambda q: q.send("q"))
    for n in range(2):
        [job] = cli.service(lambda q: q.fetch("q", ignore_start_after=True))
        cli.service(lambda q, j=job, n=n: q.fail("q", j, ValueError(f"card declined {n}")))
    table = cli("jobs", "attempts", "q", str(job_id))
    assert table.code == 0
    lines = table.out.splitlines()
    assert lines[0].split() == ["ATTEMPT", "CAUSE", "FAILED_ON", "TOOK", "WORKER", "ERROR"]
    assert "ValueError: card declined 0" in lines[1] and lines[1].split()[:2] == ["1", "failed"]
    assert "ValueError: card declined 1" in lines[2]
    found = cli.json("jobs", "attempts", "q", str(job_id))
    assert [(a["attempt"], a["error"]["message"]) for a in found] == [
        (1, "card declined 0"),
        (2, "card declined 1"),
    ]
    assert cli.json("jobs", "attempts", "q", str(uuid.uuid4())) == []
    _one_line_error(cli("jobs", "attempts", "nope", str(job_id)), "'nope' does not exist")


def test_jobs_cancel_then_resume_moves_the_jobs(cli: Cli) -> None:
    ids = _jobs(cli, 2)
    assert set(cli.json("jobs", "cancel", "q", *ids)["affected"]) == set(ids)
    assert cli.sql("SELECT DISTINCT state::text FROM {s}.job") == [("cancelled",)]
    assert set(cli.json("jobs", "resume", "q", *ids)["affected"]) == set(ids)
    assert cli.sql("SELECT DISTINCT state::text FROM {s}.job") == [("created",)]


def test_jobs_retry_gives_a_failed_job_another_attempt(cli: Cli) -> None:
    [job_id] = _jobs(cli, 1)
    cli.sql("UPDATE {s}.job SET state = 'failed', completed_on = now() WHERE id = :i", i=job_id)
    assert cli.json("jobs", "retry", "q", job_id)["affected"] == [job_id]
    assert cli.sql("SELECT state::text, retry_limit FROM {s}.job") == [("retry", 3)]


def test_jobs_delete_removes_jobs_in_any_state(cli: Cli) -> None:
    ids = _jobs(cli, 2)
    cli.json("jobs", "cancel", "q", ids[0])
    assert set(cli.json("jobs", "delete", "q", *ids)["affected"]) == set(ids)
    assert cli.sql("SELECT count(*) FROM {s}.job") == [(0,)]


def test_jobs_move_reports_jobs_it_could_not_change(cli: Cli) -> None:
    ids = _jobs(cli, 2)
    ran = cli("jobs", "resume", "q", *ids)  # neither is cancelled
    _one_line_error(ran, "2 of 2 jobs not changed")
    assert json.loads(cli("jobs", "resume", "q", ids[0], json_output=True).out)["affected"] == []


@pytest.mark.parametrize("action", ["get", "retry", "cancel", "resume", "delete"])
def test_jobs_by_id_in_an_unknown_queue_fail_with_one_line_and_exit_1(
    cli: Cli, action: str
) -> None:
    # The service's QueueNotFoundError, not "no job" nor "0 of 1 jobs not changed".
    ran = cli("jobs", action, "nope", str(uuid.uuid4()))
    _one_line_error(ran, "queue 'nope' does not exist in schema")
    assert ran.code == 1
    assert "not changed" not in ran.err and "no job" not in ran.err


def test_jobs_redrive_moves_dead_lettered_jobs_back(cli: Cli) -> None:
    cli.json("queue", "create", "dlq")
    cli.json("queue", "create", "work", "--dead-letter", "dlq")
    dead = cli.json("send", "dlq", "--data", '{"again": true}')["id"]
    moved = cli.json("jobs", "redrive", "dlq", "--to", "work")
    assert moved["from"] == "dlq" and len(moved["ids"]) == 1
    assert cli.sql("SELECT name, data FROM {s}.job WHERE id <> :i", i=dead) == [
        ("work", {"again": True})
    ]


# --------------------------------------------------------------------- flow (schema 46)


@pytest.fixture
def cli46(
    capsys: pytest.CaptureFixture[str], database_url: str, schema46: str, engine: Engine
) -> Cli:
    return Cli(capsys, database_url, schema46, engine)


def _flow_file(tmp_path: Path, jobs: Any) -> str:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(jobs))
    return str(path)


def test_flow_send_writes_the_flow_and_show_lists_parents_and_children(
    cli46: Cli, tmp_path: Path
) -> None:
    cli46.json("queue", "create", "q")
    jobs = [
        {"ref": "p", "name": "q", "data": {"n": 1}},
        {"ref": "c", "name": "q", "options": {"priority": 3}, "depends_on": ["p"]},
    ]
    ids = cli46.json("flow", "send", _flow_file(tmp_path, jobs))
    assert list(ids) == ["p", "c"]
    assert cli46.sql("SELECT parent_id::text, child_id::text FROM {s}.job_dependency") == [
        (ids["p"], ids["c"])
    ]
    cli46.service(lambda q: q.complete("q", q.fetch("q")[0]))  # only p is ready
    shown = cli46.json("flow", "show", "q", ids["c"])
    assert shown == {
        "job": {"name": "q", "id": ids["c"], "state": "created"},
        "parents": [{"name": "q", "id": ids["p"], "state": "completed"}],
        "children": [],
    }
    text = cli46("flow", "show", "q", ids["p"])
    assert text.code == 0
    assert "parents (0)" in text.out and "children (1)" in text.out and ids["c"] in text.out
    missing = str(uuid.uuid4())
    _one_line_error(cli46("flow", "show", "q", missing), f"no job {missing}")


def test_flow_send_of_a_bad_graph_exits_2_and_writes_nothing(cli46: Cli, tmp_path: Path) -> None:
    cli46.json("queue", "create", "q")
    cycle = [
        {"ref": "a", "name": "q", "depends_on": ["b"]},
        {"ref": "b", "name": "q", "depends_on": ["a"]},
    ]
    ran = cli46("flow", "send", _flow_file(tmp_path, cycle))
    assert ran.code == 2
    _one_line_error(ran, "dependency cycle: 'a' -> 'b' -> 'a'")
    (tmp_path / "flow.json").write_text("[{oops")
    bad_json = cli46("flow", "send", str(tmp_path / "flow.json"))
    assert bad_json.code == 2
    _one_line_error(bad_json, "is not valid JSON")
    assert cli46.sql("SELECT count(*) FROM {s}.job") == [(0,)]


def test_flow_send_at_schema_26_says_it_needs_46(cli: Cli, tmp_path: Path) -> None:
    cli.json("queue", "create", "q")
    pair = [{"ref": "p", "name": "q"}, {"ref": "c", "name": "q", "depends_on": ["p"]}]
    ran = cli("flow", "send", _flow_file(tmp_path, pair))
    assert ran.code == 1
    _one_line_error(ran, "flow needs a pg-boss schema at version 46")


# --------------------------------------------------------------------- schedule


def test_schedule_add_list_and_remove(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    added = cli.json(
        "schedule", "add", "q", "*/5 * * * *", "--data", '{"n": 1}', "--key", "k1",
        "--tz", "Europe/Paris", "--priority", "3",
    )  # fmt: skip
    assert added["status"] == "scheduled"
    [row] = cli.json("schedule", "list", "q")
    assert (row["key"], row["cron"], row["timezone"], row["data"]) == (
        "k1",
        "*/5 * * * *",
        "Europe/Paris",
        {"n": 1},
    )
    assert row["options"]["priority"] == 3
    table = cli("schedule", "list").out
    assert "*/5 * * * *" in table and table.splitlines()[0].startswith("NAME")
    assert cli.json("schedule", "remove", "q", "--key", "k1")["status"] == "removed"
    assert cli.json("schedule", "list") == []


def test_schedule_add_with_a_bad_cron_is_an_error(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    _one_line_error(cli("schedule", "add", "q", "every day"), "cron")
    assert cli.json("schedule", "list") == []


def test_schedule_add_on_an_unknown_queue_is_an_error(cli: Cli) -> None:
    _one_line_error(cli("schedule", "add", "nope", "* * * * *"), "'nope' does not exist")


def test_schedule_remove_of_a_missing_schedule_is_an_error(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    _one_line_error(cli("schedule", "remove", "q"), "no schedule")


# --------------------------------------------------------------------- list_jobs (service)


def test_list_jobs_returns_newest_first_and_filters_by_state(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    first = env.tx(lambda q: q.send("q", 1))
    second = env.tx(lambda q: q.send("q", 2))
    env.tx(lambda q: q.cancel("q", first))
    assert [j.id for j in env.tx(lambda q: q.list_jobs("q"))] == [second, first]
    assert [j.id for j in env.tx(lambda q: q.list_jobs("q", state="cancelled"))] == [first]
    assert [j.id for j in env.tx(lambda q: q.list_jobs("q", limit=1))] == [second]


def test_list_jobs_rejects_an_unknown_state_before_looking_up_the_queue(env: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="state"):
        env.tx(lambda q: q.list_jobs("q", state="done"))


def test_list_jobs_of_an_unknown_queue_raises(env: Any) -> None:
    with pytest.raises(QueueNotFoundError):
        env.tx(lambda q: q.list_jobs("nope"))


def test_supervise_runs_the_same_pass_as_maintain(cli: Cli) -> None:
    cli.json("queue", "create", "q")
    report = cli.json("supervise", "--force", "--no-cron")
    assert report["monitored"] == ["q"] and report["maintained"] == ["q"]
    assert report.keys() == cli.json("maintain", "--force", "--no-cron").keys()
