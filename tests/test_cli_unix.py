"""The ``alkstore`` command line as a Unix tool: one-line errors, exit codes, a closed
pipe, Ctrl-C, and idempotent ``db`` commands that say what they did.

What these tests specify is docs/reference/cli.md, "Output and exit codes". Where the
behaviour depends on the process (a real stderr, a pipe, a signal) the command runs as
``python -m alkstore_sa.cli`` in a subprocess; elsewhere through :func:`main`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.processes import sigint_as_at_a_terminal
from support.schemas import install_with_node_plan, random_schema, schema_exists, throwaway

import alkstore_sa
from alkstore_sa import QueueService
from alkstore_sa.cli import build_parser, failure, main
from alkstore_sa.errors import ForeignRevisionError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(alkstore_sa.__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "alkstore_sa.cli"]


@dataclass
class Ran:
    code: int
    out: str
    err: str


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def run(*argv: str, cwd: Path | None = None, **env: str) -> Ran:
    """``alkstore ARGV`` in a subprocess, with stdout and stderr captured."""
    done = subprocess.run(
        [*CLI, *argv],
        env=child_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """``alkstore ARGV`` in this process."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


def assert_one_line_error(ran: Ran, code: int, *fragments: str) -> str:
    assert ran.code == code, ran.err
    assert "Traceback" not in ran.err
    lines = ran.err.splitlines()
    assert len(lines) == 1, ran.err
    assert lines[0].startswith("alkstore: error: "), ran.err
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(autouse=True)
def _no_alkstore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ALKSTORE_") and name != "ALKSTORE_TEST_DATABASE_URL":
            monkeypatch.delenv(name)


def send_jobs(engine: Engine, schema: str, queue: str, count: int, data: object) -> list[str]:
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue(queue)
        ids = svc.send_many(queue, [{"data": data} for _ in range(count)])
    return [str(i) for i in ids]


# ------------------------------------------------------------ bad input: exit 2


@pytest.mark.subprocess
def test_bad_log_level_is_a_usage_error_on_one_line() -> None:
    ran = run("worker", "--app", "any:thing", "--log-level", "LOUD")
    assert_one_line_error(ran, 2, "--log-level", "'LOUD'", "DEBUG", "alkstore worker --help")


def test_bad_log_level_from_the_environment_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALKSTORE_LOG_LEVEL", "chatty")
    ran = call(capsys, "worker", "--app", "any:thing")
    assert_one_line_error(ran, 2, "--log-level", "'chatty'")


def test_log_level_is_accepted_in_any_case() -> None:
    args = build_parser().parse_args(["worker", "--log-level", "debug"])
    assert args.log_level == "DEBUG"


def test_unknown_command_is_a_usage_error_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    ran = call(capsys, "queu")
    assert_one_line_error(ran, 2, "invalid choice: 'queu'", "alkstore --help")


def test_missing_argument_is_a_usage_error_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    ran = call(capsys, "queue", "create")
    assert_one_line_error(ran, 2, "required", "name", "alkstore queue create --help")


def test_invalid_option_value_exits_2(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    ran = call(capsys, "queue", "create", "q", "--expire-seconds", "0",
               "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert_one_line_error(ran, 2, "expire_seconds")


def test_bad_queue_name_exits_2(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    ran = call(capsys, "queue", "create", "no spaces here",
               "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert_one_line_error(ran, 2, "no spaces here")


def test_bad_json_exits_2(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    ran = call(capsys, "send", "q", "--data", "{oops",
               "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert_one_line_error(ran, 2, "--data is not valid JSON")


def test_unknown_revision_exits_2(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    ran = call(capsys, "db", "upgrade", "nosuchrev",
               "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert_one_line_error(ran, 2, "nosuchrev")


def test_missing_database_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(call(capsys, "queue", "list"), 2, "ALKSTORE_DATABASE_URL")


# ------------------------------------------------------------- failures: exit 1


@pytest.mark.subprocess
def test_unreachable_database_exits_1_naming_it_without_the_password() -> None:
    ran = run("queue", "list", "--database-url", "postgresql://app:s3cret@127.0.0.1:1/shop")
    line = assert_one_line_error(ran, 1, "cannot connect to database 'shop' on 127.0.0.1:1")
    assert "s3cret" not in line and "app" not in line


def test_schema_not_installed_exits_1(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    name = random_schema()
    ran = call(capsys, "queue", "list", "--database-url", database_url, "--schema", name)
    assert_one_line_error(ran, 1, "not installed", "alkstore db upgrade")


def test_unknown_queue_exits_1(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    ran = call(capsys, "queue", "stats", "nope", "--database-url", database_url, "--schema", schema)
    assert_one_line_error(ran, 1, "'nope' does not exist")


def test_other_library_errors_exit_1(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    where = ("--database-url", database_url, "--schema", schema)
    assert call(capsys, "queue", "create", "q", *where).code == 0
    ran = call(capsys, "queue", "create", "q", "--fail-if-exists", *where)
    assert_one_line_error(ran, 1, "already exists")


def test_a_library_error_with_a_multi_line_message_is_reported_on_one_line() -> None:
    code, message = failure(ForeignRevisionError("found x.py\nand y.py", ("x.py", "y.py")))
    assert code == 1
    assert "\n" not in message
    assert message.startswith("found x.py and y.py; ")


BROKEN_APP = """
def build():
    raise RuntimeError("boom\\nsecond line")
"""


@pytest.mark.subprocess
def test_unexpected_exception_is_one_line_naming_its_type(tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text(textwrap.dedent(BROKEN_APP))
    ran = run("worker", "--app", "broken_app:build", cwd=tmp_path)
    assert_one_line_error(ran, 1, "unexpected RuntimeError: boom second line", "ALKSTORE_DEBUG=1")


@pytest.mark.subprocess
def test_debug_environment_variable_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text(textwrap.dedent(BROKEN_APP))
    ran = run("worker", "--app", "broken_app:build", cwd=tmp_path, ALKSTORE_DEBUG="1")
    assert ran.code == 1
    assert ran.err.startswith("Traceback")
    assert 'raise RuntimeError("boom' in ran.err
    assert ran.err.splitlines()[-1].startswith("alkstore: error: unexpected RuntimeError: boom")


# ------------------------------------------------------------------- SIGPIPE


def run_with_stdout_closed(*argv: str) -> Ran:
    """Run ``alkstore ARGV`` whose stdout nobody reads: the reader is gone before it writes."""
    proc = subprocess.Popen(
        [*CLI, *argv], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return Ran(proc.wait(timeout=60), "", err)


@pytest.mark.subprocess
def test_queue_create_into_a_closed_pipe_ends_quietly_with_141(
    database_url: str, schema: str
) -> None:
    ran = run_with_stdout_closed("queue", "create", "emails",
                                 "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert ran.err == ""
    assert ran.code == 141


@pytest.mark.subprocess
@pytest.mark.smoke
def test_jobs_get_into_a_closed_pipe_ends_quietly_with_141(
    database_url: str, engine: Engine, schema: str
) -> None:
    (job_id,) = send_jobs(engine, schema, "q", 1, {"n": 1})
    ran = run_with_stdout_closed("jobs", "get", "q", job_id,
                                 "--database-url", database_url, "--schema", schema)  # fmt: skip
    assert ran.err == ""
    assert ran.code == 141


@pytest.mark.subprocess
def test_output_piped_into_head_ends_quietly(
    database_url: str, engine: Engine, schema: str
) -> None:
    # Far more than a pipe buffer holds, so the writer is still writing when head exits.
    send_jobs(engine, schema, "q", 400, {"padding": "x" * 500})
    command = " ".join([*CLI, "jobs", "list", "q", "--limit", "400", "--json",
                        "--database-url", database_url, "--schema", schema])  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -1"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == "[\n"
    assert done.stderr == ""
    assert done.returncode == 141


# ---------------------------------------------------------- idempotent db commands


def test_db_upgrade_at_the_current_schema_says_already_and_exits_0(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    where = ("--database-url", database_url, "--schema", name)
    with throwaway(engine, name):
        first = call(capsys, "db", "upgrade", *where)
        assert first.code == 0, first.err
        assert "status    upgraded" in first.out
        assert "upgraded to schema 46" in first.out
        again = call(capsys, "db", "upgrade", *where)
        assert again.code == 0, again.err
        assert "status    unchanged" in again.out
        assert "already at schema 46" in again.out
        as_json = call(capsys, "db", "upgrade", "--json", *where)
        assert as_json.code == 0
        assert '"status": "unchanged"' in as_json.out


def test_db_downgrade_with_nothing_installed_says_so_and_exits_0(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        ran = call(capsys, "db", "downgrade", "--database-url", database_url, "--schema", name)
        assert ran.code == 0, ran.err
        assert "status    unchanged" in ran.out
        assert "nothing to downgrade" in ran.out
        assert not schema_exists(engine, name)


@pytest.mark.interop
def test_db_downgrade_leaves_a_schema_node_pg_boss_created_alone(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        install_with_node_plan(database_url, name)
        ran = call(capsys, "db", "downgrade", "--database-url", database_url, "--schema", name)
        assert ran.code == 0, ran.err
        assert "nothing to downgrade" in ran.out
        with engine.connect() as conn:
            found = conn.execute(text(f'SELECT version FROM "{name}".version')).scalar_one()
        assert found == 26


@pytest.mark.interop
def test_db_upgrade_of_a_schema_node_pg_boss_created_says_adopted(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        install_with_node_plan(database_url, name)
        ran = call(capsys, "db", "upgrade", "--database-url", database_url, "--schema", name)
        assert ran.code == 0, ran.err
        assert "status    adopted" in ran.out
        # The default target is 46: the adopted 26 is migrated on, and the message says so.
        assert "adopted the schema 26 Node pg-boss created, then upgraded it to schema 46" in (
            ran.out
        )


@pytest.mark.interop
def test_db_upgrade_to_26_of_a_schema_node_pg_boss_created_only_adopts_it(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        install_with_node_plan(database_url, name)
        ran = call(capsys, "db", "upgrade", "--schema-version", "26",
                   "--database-url", database_url, "--schema", name)  # fmt: skip
        assert ran.code == 0, ran.err
        assert "status    adopted" in ran.out
        assert "message   adopted the schema 26 Node pg-boss created\n" in ran.out
        with engine.connect() as conn:
            found = conn.execute(text(f'SELECT version FROM "{name}".version')).scalar_one()
        assert found == 26


# --------------------------------------------------------------------- Ctrl-C


@pytest.fixture
def stderr_file(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "stderr.txt"


def wait_for(
    condition: Callable[[], object], proc: subprocess.Popen[str], what: str, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} did not happen (exit {proc.wait()})")
        time.sleep(0.05)


def count_orders(engine: Engine, schema: str) -> int:
    with engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass(:t)"), {"t": f"{schema}.orders"}).scalar():
            return int(conn.execute(text(f'SELECT count(*) FROM "{schema}".orders')).scalar_one())
    return 0


@pytest.mark.subprocess
def test_ctrl_c_in_demo_says_interrupted_exits_130_and_drops_its_schema(
    database_url: str, engine: Engine, stderr_file: Path
) -> None:
    with stderr_file.open("w") as err:
        proc = subprocess.Popen(
            [*CLI, "demo", "--jobs", "10000", "--concurrency", "2", "--database-url", database_url],
            # faulthandler: should the demo hang after Ctrl-C, SIGABRT shows where (below).
            env=child_env(PYTHONFAULTHANDLER="1"),
            preexec_fn=sigint_as_at_a_terminal,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:

        def demo_schema() -> str | None:
            found = re.search(r"'(alkstore_demo_[0-9a-f]+)'", stderr_file.read_text())
            return found.group(1) if found else None

        wait_for(demo_schema, proc, "the demo installing its schema")
        schema = demo_schema()
        assert schema is not None
        wait_for(lambda: count_orders(engine, schema) >= 20, proc, "orders being placed")
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.communicate(timeout=30)
            raise AssertionError(
                "the demo did not end within 60 s of Ctrl-C; its threads:\n"
                + stderr_file.read_text()[-6000:]
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    err_text = stderr_file.read_text()
    assert proc.returncode == 130, err_text
    assert "Traceback" not in err_text
    assert err_text.splitlines()[-1] == "alkstore: interrupted"
    assert out == ""  # no report for an interrupted demo
    assert not schema_exists(engine, schema)


@pytest.mark.subprocess
def test_ctrl_c_in_maintain_loop_says_interrupted_and_exits_130(
    database_url: str, schema: str
) -> None:
    proc = subprocess.Popen(
        [*CLI, "maintain", "--loop", "--json", "--database-url", database_url, "--schema", schema],
        env=child_env(),
        preexec_fn=sigint_as_at_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        # The first pass is printed at once, even into a pipe: the loop is running.
        assert proc.stdout.readline().startswith("{")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err == "alkstore: interrupted\n"


# ----------------------------------------------------------------- maintain


@pytest.mark.subprocess
def test_maintain_pass_with_a_failing_step_logs_one_line_each_and_exits_1(
    database_url: str, engine: Engine, schema: str
) -> None:
    send_jobs(engine, schema, "q", 1, None)
    blocked = text(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND pid <> pg_backend_pid() AND query LIKE :s"
    )
    with engine.connect() as holder:
        # Every step that reads the jobs waits for this lock; each waiting statement is
        # cancelled, so the steps fail the way a lost connection or a timeout would.
        holder.execute(text(f'LOCK TABLE "{schema}".job IN ACCESS EXCLUSIVE MODE'))
        proc = subprocess.Popen(
            [
                *CLI,
                "maintain",
                "--force",
                "--no-cron",
                "--database-url",
                database_url,
                "--schema",
                schema,
            ],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with engine.connect() as conn:
                conn.execute(blocked, {"s": f"%{schema}%"})
            time.sleep(0.1)
        holder.rollback()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[-1].startswith("alkstore: error: supervision failed in: stats")
    # One line per failed step, as logged, naming the driver's error without its SQL.
    assert lines[:-1] and all(
        re.fullmatch(r"alkstore: error: supervision step \w+ failed: QueryCanceled: .*", line)
        and "SELECT" not in line
        for line in lines[:-1]
    ), err
    assert "errors" in out  # the pass's report still printed


@pytest.mark.subprocess
def test_queue_create_with_other_options_warns_on_one_line(database_url: str, schema: str) -> None:
    common = ("--database-url", database_url, "--schema", schema)
    assert run("queue", "create", "q", "--retry-limit", "1", *common).code == 0
    ran = run("queue", "create", "q", "--retry-limit", "9", *common)
    assert ran.code == 0
    [line] = ran.err.strip().splitlines()
    assert line.startswith("alkstore: warning: ") and "retry_limit 1 -> 9" in line
