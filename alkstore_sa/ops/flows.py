"""``flow``: jobs with dependencies between them, at schema 46 (pg-boss 12.38's ``flow``).

the "Run jobs after other jobs: flows" page describes the behaviour. Every check on the jobs
and their graph is made in Python before any SQL; then the queues are read (and locked
``FOR KEY SHARE``) and the whole flow is inserted by one statement
(:func:`alkstore_sa.sql.v46.flow.insert_flow`) in a savepoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from .. import limits, tracing
from ..errors import (
    FlowConflictError,
    InvalidOptionsError,
    QueueNotFoundError,
    shown,
)
from ..models.enums import JobState, QueuePolicy
from ..names import node_channel, queue_ref
from ..options import check_int
from ..options import job_id as _job_id
from ..records import JobDependency
from ..sql.v46 import flow as flow_sql
from ._core import Call, Conflict, Context, Op
from .sending import _check_dead_letters, _job_arrays, _refuse_unkeyed, traced

_KEYS = frozenset({"ref", "name", "data", "options", "depends_on"})


class _Graph:
    """A flow's jobs, checked: refs, queues, parents of each job (deduplicated)."""

    def __init__(self, jobs: object) -> None:
        if isinstance(jobs, Mapping | str | bytes | bytearray) or not isinstance(jobs, Iterable):
            kind = type(jobs).__name__
            raise InvalidOptionsError("jobs", f"must be a list of flow jobs, not {kind}")
        items = list(jobs)
        if len(items) < 2:
            raise InvalidOptionsError("jobs", "a flow needs at least 2 jobs")
        if len(items) > limits.MAX_FLOW_JOBS:
            raise InvalidOptionsError(
                "jobs",
                f"a flow holds at most {limits.MAX_FLOW_JOBS:,} jobs, not {len(items):,} "
                "(see the 'Limits' page)",
            )
        self.refs: list[str] = []
        self.queues: list[str] = []
        self.specs: list[dict[str, Any]] = []
        index_of: dict[str, int] = {}
        raw_parents: list[Any] = []
        for i, job in enumerate(items):
            where = f"jobs[{i}]"
            if not isinstance(job, Mapping):
                raise InvalidOptionsError(where, "each flow job must be a mapping")
            unknown = sorted(set(job) - _KEYS, key=str)
            if unknown:
                raise InvalidOptionsError(
                    f"{where}.{unknown[0]}",
                    f"unknown key; a flow job has {', '.join(sorted(_KEYS))}",
                )
            ref = job.get("ref")
            if not isinstance(ref, str) or not ref:
                raise InvalidOptionsError(f"{where}.ref", "each flow job needs a non-empty ref")
            if ref in index_of:
                raise InvalidOptionsError(
                    f"{where}.ref", f"duplicate ref {shown(ref)} (also jobs[{index_of[ref]}])"
                )
            index_of[ref] = i
            name = job.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidOptionsError(
                    f"{where}.name", f"job {shown(ref)} needs a non-empty queue name"
                )
            queue_ref(name)
            options = job.get("options")
            if options is None:
                options = {}
            if not isinstance(options, Mapping):
                raise InvalidOptionsError(f"{where}.options", "must be a mapping of send options")
            if "data" in options:
                raise InvalidOptionsError(
                    f"{where}.options.data", "a flow job's data is its own key, not an option"
                )
            depends_on = job.get("depends_on")
            if depends_on is not None and (
                isinstance(depends_on, str | bytes | Mapping)
                or not isinstance(depends_on, Iterable)
            ):
                raise InvalidOptionsError(
                    f"{where}.depends_on", f"must be a list of refs, not {shown(depends_on)}"
                )
            self.refs.append(ref)
            self.queues.append(name)
            self.specs.append({**options, "data": job.get("data")})
            raw_parents.append(list(depends_on or ()))
        if not any(raw_parents):
            raise InvalidOptionsError("jobs", "a flow needs at least one job with depends_on")
        self.parents: list[list[int]] = []
        edges = 0
        for i, parents in enumerate(raw_parents):
            seen: dict[int, None] = {}
            for dep in parents:
                where = f"jobs[{i}].depends_on"
                if not isinstance(dep, str) or not dep:
                    raise InvalidOptionsError(
                        where, f"refs must be non-empty strings, not {shown(dep)}"
                    )
                if dep == self.refs[i]:
                    raise InvalidOptionsError(where, f"job {shown(dep)} cannot depend on itself")
                if dep not in index_of:
                    raise InvalidOptionsError(where, f"ref {shown(dep)} is not a job of this flow")
                seen[index_of[dep]] = None
            self.parents.append(list(seen))
            edges += len(seen)
        if edges > limits.MAX_FLOW_DEPENDENCIES:
            raise InvalidOptionsError(
                "jobs",
                f"a flow holds at most {limits.MAX_FLOW_DEPENDENCIES:,} dependencies, "
                f"not {edges:,} (see the 'Limits' page)",
            )
        self.edges = edges
        self._refuse_cycles()

    def _refuse_cycles(self) -> None:
        n = len(self.refs)
        waiting = [len(p) for p in self.parents]
        children: list[list[int]] = [[] for _ in range(n)]
        for child, parents in enumerate(self.parents):
            for parent in parents:
                children[parent].append(child)
        ready = [i for i in range(n) if waiting[i] == 0]
        done = 0
        while ready:
            node = ready.pop()
            done += 1
            for child in children[node]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        if done == n:
            return
        # Every job left waits for a parent that is also left: walking up from any
        # of them must come back to a job already met, which closes a cycle.
        node = next(i for i in range(n) if waiting[i] > 0)
        path: list[int] = []
        met: dict[int, int] = {}
        while node not in met:
            met[node] = len(path)
            path.append(node)
            node = next(p for p in self.parents[node] if waiting[p] > 0)
        cycle = path[met[node] :]
        cycle.reverse()  # parent before child
        first = cycle.index(min(cycle))  # from the job listed first in the flow
        cycle = cycle[first:] + cycle[:first]
        names = [self.refs[i] for i in cycle] + [self.refs[cycle[0]]]
        raise InvalidOptionsError(
            "jobs",
            "dependency cycle: " + " -> ".join(repr(r) for r in names) + " (each job is a "
            "parent of the next: none of them could ever run)",
        )


def flow(ctx: Context, jobs: object) -> Op[dict[str, uuid.UUID]]:
    """Insert jobs with dependencies in the caller's transaction; see ``QueueService.flow``."""
    ctx.require("flow")
    graph = _Graph(jobs)
    arrays, ids = _job_arrays(graph.specs, ctx.version)
    taken: dict[tuple[str, uuid.UUID], int] = {}
    for i, (queue, job_id) in enumerate(zip(graph.queues, ids, strict=True)):
        first = taken.setdefault((queue, job_id), i)
        if first != i:
            raise InvalidOptionsError(
                f"jobs[{i}].options.id",
                f"id {job_id} is also the id of jobs[{first}] in queue {shown(queue)}",
            )
    wanted = list(dict.fromkeys(graph.queues))

    def body(span: tracing.Producing) -> Op[dict[str, uuid.UUID]]:
        return _flow(ctx, graph, ids, arrays, wanted, span.carrier)

    # pg-boss names the span after the flow's queue when it has only one.
    destination = wanted[0] if len(wanted) == 1 else None
    return (yield from traced(ctx, "flow", destination, len(ids), body, _flow_ids))


def _flow_ids(refs: dict[str, uuid.UUID]) -> list[uuid.UUID]:
    return list(refs.values())


def _flow(
    ctx: Context,
    graph: _Graph,
    ids: list[uuid.UUID],
    arrays: dict[str, Any],
    wanted: list[str],
    carrier: str | None,
) -> Op[dict[str, uuid.UUID]]:
    # The queues, locked so that none is deleted before the flow is in.
    result = yield Call(flow_sql.lock_queues(), {"names": wanted})
    policies = {row.name: row.policy for row in result.all()}
    for queue in wanted:
        if queue not in policies:
            raise QueueNotFoundError(queue, ctx.schema)
    for i, queue in enumerate(graph.queues):
        if policies[queue] == QueuePolicy.KEY_STRICT_FIFO and not graph.specs[i].get(
            "singleton_key"
        ):
            raise _refuse_unkeyed(queue)
    for queue in wanted:
        yield from _check_dead_letters(
            queue, [s for s, q in zip(graph.specs, graph.queues, strict=True) if q == queue]
        )
    blocking = [False] * len(ids)
    deps: dict[str, list[Any]] = {f"dep_{n}": [] for n, _ in flow_sql.DEPENDENCY_INPUTS}
    for child, parents in enumerate(graph.parents):
        for parent in parents:
            blocking[parent] = True
            deps["dep_child_name"].append(graph.queues[child])
            deps["dep_child_id"].append(ids[child])
            deps["dep_parent_name"].append(graph.queues[parent])
            deps["dep_parent_id"].append(ids[parent])
    given = frozenset(k[3:] for k in arrays)
    params = {
        **arrays,
        **deps,
        "in_flow_queue": graph.queues,
        "in_flow_blocking": blocking,
        "in_flow_pending": [len(p) for p in graph.parents],
        "channel": ctx.channel,
        "node_channel": node_channel(ctx.schema),
        "trace_context": carrier,
    }
    stmt = flow_sql.insert_flow(notify=ctx.notify, given=given, traced=carrier is not None)
    try:
        row = (yield Call(stmt, params, savepoint=True)).one()
    except Conflict:
        raise FlowConflictError(wanted) from None
    # The queues are locked and every job inserted or none: anything else is a bug.
    assert row.inserted == len(ids), (row.inserted, len(ids))
    return dict(zip(graph.refs, ids, strict=True))


DEPENDENCIES_LIMIT = 1000
"""How many parents or children one read returns by default (pg-boss's list default)."""

DEPENDENCIES_LIMIT_MAX = 100_000
"""The most one read may ask for (pg-boss's list maximum)."""


def _after(after: object) -> tuple[str, uuid.UUID] | None:
    if after is None:
        return None
    if isinstance(after, JobDependency):
        return after.name, after.id
    if isinstance(after, tuple) and len(after) == 2 and isinstance(after[0], str) and after[0]:
        try:
            return after[0], _job_id(after[1])
        except InvalidOptionsError:
            pass
    raise InvalidOptionsError(
        "after",
        "must be the last JobDependency of the previous page or a (queue, id) pair, "
        f"not {shown(after)}",
    )


def related_jobs(
    ctx: Context, name: str, id: object, *, parents: bool, limit: object, after: object
) -> Op[list[JobDependency]]:
    """A flow job's parents or children (``QueueService.get_dependencies`` and
    ``get_dependents``); an unknown job has none."""
    queue_ref(name)
    ident = _job_id(id)
    count = check_int(
        "limit",
        DEPENDENCIES_LIMIT if limit is None else limit,
        minimum=1,
        maximum=DEPENDENCIES_LIMIT_MAX,
    )
    past = _after(after)
    ctx.require("flow", "get_dependencies" if parents else "get_dependents")
    params: dict[str, Any] = {"qname": name, "id": ident, "limit": count}
    if past is not None:
        params["after_name"], params["after_id"] = past
    stmt = flow_sql.related_jobs(parents=parents, after=past is not None)
    rows = (yield Call(stmt, params)).all()
    return [
        JobDependency(r.name, r.id, None if r.state is None else JobState(r.state)) for r in rows
    ]


__all__ = ["DEPENDENCIES_LIMIT", "DEPENDENCIES_LIMIT_MAX", "flow", "related_jobs"]
