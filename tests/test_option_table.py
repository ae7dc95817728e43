"""The option table: every queue and send option is declared once in
``alkstore_sa.options.OPTIONS``, and the typed options, the command line, the pg-boss
JSON mappings, validation, the send statement and inline mode all follow it."""

from __future__ import annotations

import argparse
import datetime as dt
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from alkstore_sa import JobSpec, QueueOptions, SendOptions, TimedSendOptions
from alkstore_sa import options as opt
from alkstore_sa.cli import build_parser
from alkstore_sa.cli._options import SEND, given_options
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.sql.v26 import send as send_sql
from alkstore_sa.testing import InlineQueueService

PUBLIC_SEND = {o.name for o in opt.OPTIONS if o.send and o.public}
QUEUE = {o.name for o in opt.OPTIONS if o.queue}
INTS = [o for o in opt.OPTIONS if o.kind == "int"]

# pg-boss's documented defaults (its createQueue and send options).
PGBOSS_DEFAULTS: dict[str, Any] = {
    "priority": 0,
    "policy": "standard",
    "partition": False,
    "retry_limit": 2,
    "retry_delay": 0,
    "retry_backoff": False,
    "expire_seconds": 15 * 60,
    "retention_seconds": 14 * 24 * 3600,
    "deletion_seconds": 7 * 24 * 3600,
    "warning_queued": 0,
    "notify": False,
}

# One valid value per send option, in the form pg-boss stores it.
PGBOSS_SAMPLES: dict[str, Any] = {
    "id": "8f0c2f4e-9a53-4c47-9f40-0b6f3d1f2a10",
    "priority": 5,
    "start_after": 30,
    "singleton_key": "k",
    "singleton_seconds": 60,
    "dead_letter": "dlq",
    "retry_limit": 4,
    "retry_delay": 3,
    "retry_backoff": True,
    "retry_delay_max": 9,
    "expire_seconds": 70,
    "retention_seconds": 80,
    "deletion_seconds": 90,
    "heartbeat_seconds": 30,
    "group_id": "acme",
    "group_tier": "gold",
}

# The options every schema has (the others need pg-boss schema 46).
AT_26 = {o.name for o in opt.OPTIONS if o.since <= 26}
NEW_AT_46 = {o.name for o in opt.OPTIONS} - AT_26


# ------------------------------------------------------------- typed options


def test_typed_options_have_exactly_the_tables_keys() -> None:
    assert set(QueueOptions.__annotations__) == QUEUE == opt.QUEUE_OPTION_NAMES
    assert set(SendOptions.__annotations__) == PUBLIC_SEND == opt.SEND_OPTION_NAMES
    assert set(TimedSendOptions.__annotations__) == PUBLIC_SEND - {"start_after"}
    assert set(JobSpec.__annotations__) == PUBLIC_SEND | {"data"}


def _admitted(annotation: Any) -> set[Any]:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation))
    return {annotation}


@pytest.mark.parametrize("typed", [QueueOptions, SendOptions], ids=lambda t: t.__name__)
def test_typed_options_admit_the_tables_python_types(typed: Any) -> None:
    hints = typing.get_type_hints(typed)
    for name, annotation in hints.items():
        assert set(opt.OPTION[name].python_types) <= _admitted(annotation), name


# ------------------------------------------------------------- command line


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


def _option_flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {
        a.dest[len("opt_") :]: list(a.option_strings)
        for a in parser._actions
        if a.dest.startswith("opt_")
    }


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (("queue", "create"), QUEUE),
        (("queue", "update"), opt.UPDATABLE_QUEUE_OPTIONS),
        (("send",), PUBLIC_SEND),
        (("schedule", "add"), PUBLIC_SEND - {"id"}),
    ],
    # Named by the command alone: a set's order changes from one process to the next, and
    # pytest-xdist's workers must collect the same ids.
    ids=["queue-create", "queue-update", "send", "schedule-add"],
)
def test_command_line_flags_are_the_tables(command: tuple[str, ...], expected: set[str]) -> None:
    flags = _option_flags(_subparser(build_parser(), *command))
    assert set(flags) == set(expected)
    for name, strings in flags.items():
        assert strings[0] == opt.OPTION[name].flag


def test_every_public_option_has_a_command_line_flag() -> None:
    parser = build_parser()
    everywhere = set(_option_flags(_subparser(parser, "queue", "create"))) | set(
        _option_flags(_subparser(parser, "send"))
    )
    assert everywhere == {o.name for o in opt.OPTIONS if o.public}


def test_command_line_values_reach_the_service_in_the_tables_types() -> None:
    args = build_parser().parse_args(
        ["send", "q", "--retry-limit", "3", "--retry-backoff", "--singleton-key", "k"]
    )
    assert given_options(args, SEND) == {
        "retry_limit": 3,
        "retry_backoff": True,
        "singleton_key": "k",
    }


# ------------------------------------------------------------- pg-boss JSON


def test_every_send_option_round_trips_through_pgboss_json() -> None:
    assert set(PGBOSS_SAMPLES) == PUBLIC_SEND
    stored = opt.to_pgboss_send_options(PGBOSS_SAMPLES)
    # A dotted key is a field of one of pg-boss's object options (group: {id, tier}).
    assert set(stored) == {opt.OPTION[n].pgboss.split(".")[0] for n in PUBLIC_SEND}
    assert stored["group"] == {"id": "acme", "tier": "gold"}
    assert opt.from_pgboss_send_options(stored) == PGBOSS_SAMPLES
    assert opt.to_pgboss_send_options(opt.from_pgboss_send_options(stored)) == stored


def test_send_options_are_stored_in_the_forms_node_reads() -> None:
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    stored = opt.to_pgboss_send_options(
        {"id": uuid.UUID(PGBOSS_SAMPLES["id"]), "start_after": when, "retry_limit": 1}
    )
    assert stored == {
        "id": PGBOSS_SAMPLES["id"],
        "startAfter": "2030-01-02T03:04:05.000Z",
        "retryLimit": 1,
    }


def test_unknown_pgboss_keys_are_dropped_when_read_back() -> None:
    assert opt.from_pgboss_send_options({"retryLimit": 1, "tz": "UTC", "key": ""}) == {
        "retry_limit": 1
    }


def test_queue_options_reach_create_queue_under_pgboss_keys() -> None:
    given = {o.name: o.default for o in opt.OPTIONS if o.queue and o.default is not None}
    given |= {"dead_letter": "dlq", "retry_delay_max": 5, "retry_backoff": True}
    given |= {"heartbeat_seconds": 30}
    json = opt.pgboss_queue_json("q", given)
    assert set(json) == {opt.OPTION[n].pgboss for n in QUEUE}
    assert json["retryDelayMax"] == 5 and json["deadLetter"] == "dlq"


# ------------------------------------------------------------- validation


@pytest.mark.parametrize("spec", INTS, ids=lambda s: s.name)
def test_integer_options_accept_their_bounds_and_refuse_one_beyond(spec: Any) -> None:
    assert opt.check_option(spec.name, spec.minimum) == spec.minimum
    assert opt.check_option(spec.name, spec.maximum) == spec.maximum
    for value in (spec.minimum - 1, spec.maximum + 1):
        with pytest.raises(InvalidOptionsError, match="must be between") as caught:
            opt.check_option(spec.name, value)
        assert caught.value.option == spec.name


@pytest.mark.parametrize("spec", INTS, ids=lambda s: s.name)
def test_integer_bounds_hold_for_create_queue_and_send(spec: Any) -> None:
    check = opt.queue_options if spec.queue else None
    for value in (spec.minimum - 1, spec.maximum + 1):
        if spec.send:
            with pytest.raises(InvalidOptionsError) as caught:
                opt.send_options({spec.name: value})
            assert caught.value.option == spec.name
        if check is not None:
            with pytest.raises(InvalidOptionsError) as caught:
                check("q", {spec.name: value})
            assert caught.value.option == spec.name


def test_expire_seconds_stays_below_a_day_as_pgboss_requires() -> None:
    assert opt.OPTION["expire_seconds"].maximum == 24 * 3600 - 1


@pytest.mark.parametrize(
    "check",
    [
        lambda o: opt.send_options(o),
        lambda o: opt.queue_options("q", o),
        lambda o: opt.check_requirements(o, {"retry_backoff": False}),
    ],
    ids=["send", "create_queue", "update_queue"],
)
def test_retry_delay_max_requires_retry_backoff_everywhere(check: Any) -> None:
    for refused in ({"retry_delay_max": 5}, {"retry_delay_max": 5, "retry_backoff": False}):
        with pytest.raises(InvalidOptionsError, match="only allowed with retry_backoff=True"):
            check(refused)
    check({"retry_delay_max": 5, "retry_backoff": True})
    check({"retry_delay_max": None})


def test_update_sees_the_queues_current_values_in_the_rules() -> None:
    current = {"retry_backoff": True, "retry_delay_max": 10}
    opt.check_requirements({"retry_delay_max": 20}, current)
    with pytest.raises(InvalidOptionsError, match="retry_delay_max"):
        opt.check_requirements({"retry_backoff": False}, current)
    opt.check_requirements({"retry_backoff": False, "retry_delay_max": None}, current)


def test_every_requirement_names_an_option_of_the_table() -> None:
    for spec in opt.OPTIONS:
        if spec.requires is not None:
            other = opt.OPTION[spec.requires[0]]
            assert (other.queue, other.send) == (spec.queue, spec.send)


# ------------------------------------------------------------- schema versions


def test_options_new_at_46_are_declared_with_their_version() -> None:
    assert {o.name for o in opt.OPTIONS if o.since == 46} == {
        "heartbeat_seconds",
        "notify",
        "group_id",
        "group_tier",
    }
    assert {o.name for o in opt.OPTIONS if o.since not in (26, 46)} == set()


@pytest.mark.parametrize(
    ("check", "what"),
    [
        (lambda o, v: opt.queue_options("q", o, version=v), "queue"),
        (lambda o, v: opt.queue_options("q", o, update=True, version=v), "queue"),
        (lambda o, v: opt.send_options(o, version=v), "send"),
    ],
    ids=["create_queue", "update_queue", "send"],
)
def test_options_of_46_are_refused_at_26_naming_option_and_versions(check: Any, what: str) -> None:
    names = ["heartbeat_seconds"] + (["notify"] if what == "queue" else [])
    for name in names:
        value = True if name == "notify" else 30
        with pytest.raises(InvalidOptionsError) as caught:
            check({name: value}, 26)
        assert caught.value.option == name
        assert f"needs pg-boss schema 46 (a {what} option of pg-boss 12)" in str(caught.value)
        assert "this schema is at 26" in str(caught.value)
        assert check({name: value}, 46) == {name: value}
        # No schema (inline mode): nothing to refuse.
        assert check({name: value}, None) == {name: value}


@pytest.mark.parametrize(
    "check",
    [
        lambda o, v: opt.queue_options("q", o, version=v),
        lambda o, v: opt.queue_options("q", o, update=True, version=v),
        lambda o, v: opt.send_options(o, version=v),
    ],
    ids=["create_queue", "update_queue", "send"],
)
def test_deletion_seconds_zero_keeps_at_46_and_is_refused_at_26(check: Any) -> None:
    assert check({"deletion_seconds": 0}, 46) == {"deletion_seconds": 0}
    with pytest.raises(InvalidOptionsError, match="at least 1 at schema 26, not 0") as caught:
        check({"deletion_seconds": 0}, 26)
    assert caught.value.option == "deletion_seconds"
    assert check({"deletion_seconds": 1}, 26) == {"deletion_seconds": 1}
    with pytest.raises(InvalidOptionsError, match="between 0 and"):
        check({"deletion_seconds": -1}, 46)


def test_heartbeat_seconds_below_pgboss_minimum_of_10_is_refused() -> None:
    with pytest.raises(InvalidOptionsError, match="between 10 and"):
        opt.send_options({"heartbeat_seconds": 9}, version=46)
    assert opt.queue_options("q", {"heartbeat_seconds": None}, update=True, version=46) == {
        "heartbeat_seconds": None
    }


def test_options_of_46_reach_create_queue_under_pgboss_keys() -> None:
    json = opt.pgboss_queue_json("q", {"notify": True, "heartbeat_seconds": 30})
    assert json == {"notify": True, "heartbeatSeconds": 30, "policy": "standard"}


def test_a_schema_at_26_refuses_options_of_46_without_touching_the_transaction(
    env: Any,
) -> None:
    def attempts(q: Any) -> list[tuple[str, str]]:
        caught: list[tuple[str, str]] = []
        calls: list[Callable[[], Any]] = [
            lambda: q.create_queue("n", notify=True),
            lambda: q.create_queue("n", heartbeat_seconds=30),
            lambda: q.create_queue("n", deletion_seconds=0),
            lambda: q.update_queue("q", notify=True),
            lambda: q.update_queue("q", deletion_seconds=0),
            lambda: q.send("q", None, heartbeat_seconds=30),
            lambda: q.send("q", None, deletion_seconds=0),
            lambda: q.schedule("q", "* * * * *", None, heartbeat_seconds=30),
        ]
        for call in calls:
            try:
                call()
            except InvalidOptionsError as exc:
                caught.append((exc.option, str(exc)))
        # The transaction is still usable: nothing was sent to the database.
        q.send("q", {"after": True})
        return caught

    env.tx(lambda q: q.create_queue("q"))
    caught = env.tx(attempts)
    assert [option for option, _ in caught] == [
        "notify",
        "heartbeat_seconds",
        "deletion_seconds",
        "notify",
        "deletion_seconds",
        "heartbeat_seconds",
        "deletion_seconds",
        "heartbeat_seconds",
    ]
    assert all("schema 26" in message or "is at 26" in message for _, message in caught)
    assert [r.data for r in env.sql("SELECT data FROM {s}.job")] == [{"after": True}]
    assert env.sql("SELECT name FROM {s}.queue WHERE name = 'n'") == []


# ------------------------------------------------------------- send statement


def test_send_statement_binds_one_input_per_send_option() -> None:
    names = [n for n, _ in send_sql.INPUT_COLUMNS]
    assert len(names) == len(set(names))
    expected = {o.name for o in opt.OPTIONS if o.send and o.kind != "when"}
    assert set(names) == expected | {"data", "start_at", "start_in"}


# ------------------------------------------------------------- defaults


def test_table_defaults_are_pgboss_defaults() -> None:
    declared = {o.name: o.default for o in opt.OPTIONS if o.default is not None}
    assert declared == PGBOSS_DEFAULTS


def test_inline_jobs_take_pgboss_defaults() -> None:
    jobs = InlineQueueService({"q": lambda job: None})
    jobs.send("q", None)
    [job] = jobs.performed
    for spec in opt.OPTIONS:
        if spec.send and spec.public and spec.job_column and spec.name != "id":
            assert getattr(job, spec.job_column) == PGBOSS_DEFAULTS.get(spec.name), spec.name
    assert job.keep_until - job.start_after == dt.timedelta(
        seconds=PGBOSS_DEFAULTS["retention_seconds"]
    )


def test_inline_mode_validates_options_as_send_does() -> None:
    jobs = InlineQueueService({"q": lambda job: None})
    for bad in ({"retry_limit": -1}, {"retry_delay_max": 5}, {"colour": 1}):
        with pytest.raises(InvalidOptionsError):
            jobs.send("q", None, **bad)
    assert jobs.performed == []


def test_a_queue_created_without_options_gets_the_tables_defaults(env: Any) -> None:
    info = env.tx(lambda q: q.create_queue("q"))
    for spec in opt.OPTIONS:
        if spec.queue and spec.queue_column:
            value = getattr(info, spec.queue_column)
            assert getattr(value, "value", value) == spec.default, spec.name


def test_a_queue_created_without_options_at_46_gets_the_tables_defaults(env46: Any) -> None:
    info = env46.tx(lambda q: q.create_queue("q"))
    [stored] = env46.sql("SELECT heartbeat_seconds, notify FROM {s}.queue WHERE name = 'q'")
    assert (stored.heartbeat_seconds, stored.notify) == (None, False)
    for spec in opt.OPTIONS:
        if spec.queue and spec.queue_column:
            value = getattr(info, spec.queue_column)
            assert getattr(value, "value", value) == spec.default, spec.name


def test_a_job_sent_without_options_matches_the_inline_job(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    job_id = env.tx(lambda q: q.send("q", None))
    [row] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    jobs = InlineQueueService({"q": lambda job: None})
    jobs.send("q", None)
    [inline] = jobs.performed
    for spec in opt.OPTIONS:
        if spec.send and spec.public and spec.job_column and spec.name not in ("id", *NEW_AT_46):
            assert getattr(row, spec.job_column) == getattr(inline, spec.job_column), spec.name


def _send_every_option(env: Any, names: set[str]) -> tuple[dict[str, Any], Any]:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("q"))
    given = {k: v for k, v in PGBOSS_SAMPLES.items() if k != "start_after" and k in names}
    job_id = env.tx(lambda q: q.send("q", None, **given))
    [row] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return given, row


def test_every_send_option_of_26_reaches_its_job_column(env: Any) -> None:
    given, row = _send_every_option(env, AT_26)
    for spec in opt.OPTIONS:
        if spec.send and spec.public and spec.job_column and spec.name in AT_26:
            value = getattr(row, spec.job_column)
            assert (str(value) if spec.kind == "uuid" else value) == given[spec.name], spec.name
    assert row.keep_until - row.start_after == dt.timedelta(seconds=given["retention_seconds"])


def test_every_send_option_of_46_reaches_its_job_column(env46: Any) -> None:
    given, row = _send_every_option(env46, PUBLIC_SEND)
    assert "heartbeat_seconds" in given
    for spec in opt.OPTIONS:
        if spec.send and spec.public and spec.job_column:
            value = getattr(row, spec.job_column)
            assert (str(value) if spec.kind == "uuid" else value) == given[spec.name], spec.name
    assert row.keep_until - row.start_after == dt.timedelta(seconds=given["retention_seconds"])
