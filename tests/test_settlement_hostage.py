"""No failure holds a worker's other work hostage: an error of any size is kept bounded,
and a settlement the database refuses for good is split item by item, its bad item
failed with a small output, while every other completion and failure goes on
(docs/concepts/guarantees.md, "One bad settlement stops nobody else")."""

from __future__ import annotations

import uuid
from typing import Any

from support.worker import Harness, send, state_of, wait_for

from alkstore_sa.limits import MAX_ERROR_TEXT_BYTES, MAX_PAYLOAD_BYTES

HUGE = 2 * 1024 * 1024


def _states(h: Harness, queue: str) -> dict[str, int]:
    rows = h.sql("SELECT state::text, count(*) FROM {s}.job WHERE name = :q GROUP BY 1", q=queue)
    return {state: int(n) for state, n in rows}


def _output(h: Harness, job_id: uuid.UUID) -> Any:
    [(output,)] = h.sql("SELECT output FROM {s}.job WHERE id = :i", i=job_id)
    return output


def _huge_error_does_not_stop_other_queues(h: Harness) -> None:
    h.service_tx(lambda q: q.create_queue("bad", retry_limit=0))
    h.service_tx(lambda q: q.create_queue("good"))
    bad = send(h, "bad")
    h.service_tx(lambda q: q.send_many("good", [{"data": {"n": n}} for n in range(100)]))

    def explode(job: Any) -> None:
        raise RuntimeError("x" * HUGE)

    w = h.worker(poll_interval=0.1)
    w.register("bad", h.handler(explode))
    w.register("good", h.handler(lambda job: {"n": job.data["n"]}), concurrency=8)
    h.start(w)
    # Promptly: a lease (expire_seconds, 15 minutes by default) never runs out here.
    wait_for(lambda: _states(h, "good") == {"completed": 100}, timeout=20)
    wait_for(lambda: state_of(h, "bad", bad) == "failed")
    h.stop(w)
    output = _output(h, bad)
    # The real error, bounded: not "job timed out", not a fallback about its size.
    assert output["name"] == "RuntimeError"
    assert output["message"].startswith("xxxx")
    assert len(output["message"].encode()) <= MAX_ERROR_TEXT_BYTES
    assert len(output["stack"].encode()) <= MAX_ERROR_TEXT_BYTES
    assert output["truncated"] > HUGE
    assert w.stats()["good"].completed == 100 and w.stats()["bad"].failed == 1
    # Each good job ran once: none was expired and run again.
    assert w.stats()["good"].fetched == 100


def test_a_huge_error_message_holds_no_other_queue_hostage(harness: Harness) -> None:
    _huge_error_does_not_stop_other_queues(harness)


def test_a_huge_error_message_holds_no_other_queue_hostage_at_46(harness46: Harness) -> None:
    _huge_error_does_not_stop_other_queues(harness46)


def test_a_huge_error_chained_in_an_except_is_bounded_too(harness: Harness) -> None:
    # The handler's own except chains the huge error into another one: the stack of
    # the second carries the first's message, and is bounded all the same.
    h = harness
    h.service_tx(lambda q: q.create_queue("bad", retry_limit=0))
    bad = send(h, "bad")

    def explode(job: Any) -> None:
        try:
            raise ValueError("y" * HUGE)
        except ValueError:
            raise KeyError("chained")  # noqa: B904 (chained on purpose)

    w = h.worker(poll_interval=0.1)
    w.register("bad", h.handler(explode))
    h.start(w)
    wait_for(lambda: state_of(h, "bad", bad) == "failed")
    h.stop(w)
    output = _output(h, bad)
    assert output["name"] == "KeyError" and output["message"] == "'chained'"
    assert "yyyy" in output["stack"]
    assert len(output["stack"].encode()) <= MAX_ERROR_TEXT_BYTES


def test_a_result_too_large_fails_its_job_with_a_small_output(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    big = send(h, "q", {"big": True})
    small = [send(h, "q", {"big": False}) for _ in range(5)]

    def result(job: Any) -> Any:
        if job.data["big"]:
            try:
                raise OSError("z" * HUGE)
            except OSError:
                return {"blob": "b" * (MAX_PAYLOAD_BYTES + 10)}
        return {"ok": True}

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(result), concurrency=6)
    h.start(w)
    wait_for(lambda: all(state_of(h, "q", j) == "completed" for j in small))
    wait_for(lambda: state_of(h, "q", big) == "failed")
    h.stop(w)
    output = _output(h, big)
    assert output["name"] == "InvalidOptionsError"
    assert "more than the limit" in output["message"]
    # Built outside the except that met it: no chained traceback of the huge error.
    assert len(str(output).encode()) < 4 * MAX_ERROR_TEXT_BYTES


REFUSE_COMPLETION = """
CREATE FUNCTION {s}.refuse_settlement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.output ? 'refuse' OR NEW.output->>'name' = 'Doomed' THEN
    RAISE EXCEPTION 'refused by the application''s trigger';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_settlement BEFORE INSERT OR UPDATE ON {s}.job
  FOR EACH ROW EXECUTE FUNCTION {s}.refuse_settlement();
"""


def _refused_settlements_are_split(h: Harness) -> None:
    h.service_tx(lambda q: q.create_queue("done", retry_limit=0))
    h.service_tx(lambda q: q.create_queue("fails", retry_limit=0))
    h.sql(REFUSE_COMPLETION)
    refused = send(h, "done", {"n": 0})
    completing = [send(h, "done", {"n": n}) for n in range(1, 20)]
    doomed = send(h, "fails", {"doomed": True})
    failing = [send(h, "fails", {"doomed": False}) for _ in range(10)]

    class Doomed(Exception):
        pass

    def finish(job: Any) -> Any:
        return {"refuse": True} if job.data["n"] == 0 else {"n": job.data["n"]}

    def fail(job: Any) -> None:
        raise Doomed("the trigger refuses me") if job.data["doomed"] else ValueError("plain")

    w = h.worker(poll_interval=0.1, flush_interval=0.2)
    w.register("done", h.handler(finish), concurrency=20)
    w.register("fails", h.handler(fail), concurrency=11)
    h.start(w)
    wait_for(lambda: all(state_of(h, "done", j) == "completed" for j in completing))
    wait_for(lambda: all(state_of(h, "fails", j) == "failed" for j in failing))
    wait_for(lambda: state_of(h, "done", refused) == "failed")
    wait_for(lambda: state_of(h, "fails", doomed) == "failed")
    h.stop(w)
    for job_id in failing:
        assert _output(h, job_id)["name"] == "ValueError"
    for job_id, verb in ((refused, "complete"), (doomed, "fail")):
        output = _output(h, job_id)
        assert output["name"] == "SettlementRefused", output
        assert f"could not {verb} job {job_id}" in output["message"]
        assert "refused by the application's trigger" in output["message"]
    assert w.stats()["done"].completed == 19


def test_a_settlement_the_database_refuses_is_split_and_only_its_job_fails(
    harness: Harness,
) -> None:
    _refused_settlements_are_split(harness)


def test_a_settlement_the_database_refuses_is_split_at_46(harness46: Harness) -> None:
    _refused_settlements_are_split(harness46)
