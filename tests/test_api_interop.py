"""The HTTP API from outside Python: the curl session and the Node client of
docs/how-to/http-api.md, run as written against a served API, while a Python Worker and
Node pg-boss 12.38 work the same queue."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, text
from support.node import NODE46_BINARY, NodeBoss46, in_tx, node46, node46_modules, node_url
from support.worker import wait_for

from alkstore_sa import Worker
from alkstore_sa._hosts import listen
from alkstore_sa.api import create_app

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used here

pytestmark = pytest.mark.interop

PAGE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "http-api.md"
TOKEN = "interop-" + "k" * 32


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def curl_session() -> str:
    """The page's curl session: its commands (``$ `` lines), as one bash script."""
    [session] = [b for b in blocks("console") if "$API" in b]
    commands = [line[2:] for line in session.splitlines() if line.startswith("$ ")]
    return "set -euo pipefail\n" + "\n".join(commands) + "\n"


@pytest.fixture
def served(engine: Engine, schema46: str) -> Iterator[str]:
    """The API on a free loopback port, with a token; its base URL."""
    app = create_app(engine, schemas=[schema46], auth=[TOKEN])
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def outside(command: list[str], url: str, timeout: float = 60) -> str:
    env = {**os.environ, "API": url, "TOKEN": TOKEN}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def test_curl_and_a_node_fetch_client_share_a_queue_with_python_and_node_pgboss(
    engine: Engine,
    schema46: str,
    served: str,
    node46: Callable[..., NodeBoss46],
    tmp_path: Path,
) -> None:
    # The curl session as the page shows it: create, send, fetch, complete, a refusal.
    answers = outside(["bash", "-c", curl_session()], served)
    assert '"title":"InvalidOptionsError"' in answers
    [(first_output,)] = in_tx(
        engine,
        schema46,
        lambda q: [(j.output,) for j in q.list_jobs("thumbnails", state="completed")],
    )
    assert first_output == {"bytes": 18342}

    # A backlog, then three kinds of worker at once: the page's Node client over HTTP,
    # a Python Worker and Node pg-boss 12.38, each writing who it was.
    in_tx(
        engine,
        schema46,
        lambda q: q.send_many("thumbnails", [{"data": {"image": f"{n}.png"}} for n in range(60)]),
    )
    boss = node46(schema46)
    boss.call(
        "work",
        "thumbnails",
        {"pollingIntervalSeconds": 0.5},
        {"output": {"by": "node"}, "sleepMs": 30},
    )

    def python_handler(job: Any) -> dict[str, str]:
        time.sleep(0.03)
        return {"by": "python"}

    worker = Worker(engine, schema=schema46, supervise=False, poll_interval=0.2)
    worker.register("thumbnails", python_handler)
    worker.start()
    try:
        script = tmp_path / "client.mjs"
        script.write_text(blocks("js")[0])
        outside([str(NODE46_BINARY), str(script)], served, timeout=120)

        def settled() -> bool:
            with engine.connect() as conn:
                left = conn.execute(
                    text(
                        f"SELECT count(*) FROM \"{schema46}\".job WHERE name = 'thumbnails'"
                        " AND state < 'completed'"
                    )
                ).scalar_one()
            return int(left) == 0

        wait_for(settled, timeout=60)
    finally:
        worker.stop()
        boss.close()
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT state::text, output->>'by' FROM \"{schema46}\".job"
                " WHERE name = 'thumbnails' AND output ? 'by'"
            )
        ).all()
    by = [who for _, who in rows]
    # 60 sent here and 2 by the client: each completed once, by one of the three.
    assert len(rows) == 62 and {state for state, _ in rows} == {"completed"}
    assert set(by) <= {"http", "python", "node"}
    assert by.count("http") >= 1 and by.count("python") >= 1 and by.count("node") >= 1
    assert not [e for e in boss.errors() if e.get("event") == "error"]
