"""The dashboard's actions: what a POST changes, each in a transaction of its
own after the form's CSRF token is checked (the "Browse and act in the dashboard" page).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..errors import shown
from ..names import queue_ref
from ..service import QueueService
from ._render import segment
from ._security import safe_next
from ._state import STATES, BadRequest, Dashboard, in_path, parse_uuid

ACTIONS = ("retry", "cancel", "resume", "delete", "redrive")
BULK_MAX = 1000
"""At most this many jobs per action (one confirmation, one transaction)."""
SEND_MAX = 1_000_000  # characters of JSON in the send form


async def _form(request: Request, d: Dashboard) -> Any:
    if d.read_only:
        raise HTTPException(403, "this dashboard is read-only")
    # Room for BULK_MAX ids and a few fields more, so that too many ids get
    # the action's own message; no file uploads.
    form = await request.form(max_files=0, max_fields=BULK_MAX + 50)
    d.check_csrf(request, form)
    return form


def _action_targets(action: str, form: Any) -> tuple[list[uuid.UUID], str]:
    """The jobs or queue an action names, every field checked before the
    confirmation page (nothing unchecked is shown or re-posted)."""
    raw = [str(v).strip() for v in form.getlist("ids") if str(v).strip()]
    if len(raw) > BULK_MAX:
        raise BadRequest(f"ids: at most {BULK_MAX} jobs per action, not {len(raw)}")
    ids = list(dict.fromkeys(parse_uuid("ids", v) for v in raw))
    queue = str(form.get("queue", "")).strip()
    if form.get("scope") == "selected" and not ids:
        raise BadRequest("select at least one job")
    if not ids and not queue:
        raise BadRequest("name the jobs (ids) or the queue to act on")
    if queue:
        queue_ref(queue, "queue")
    to = str(form.get("to", "")).strip()
    if action == "redrive":
        if not queue:
            raise BadRequest("redrive needs the dead-letter queue (queue)")
        if to:
            queue_ref(to, "to")
    if action == "delete" and not ids and str(form.get("state", "")) not in STATES:
        raise BadRequest(f"a queue-wide delete needs a state (state): one of {', '.join(STATES)}")
    return ids, queue


def _describe(action: str, ids: list[uuid.UUID], queue: str, form: Any) -> str:
    if action == "redrive":
        to = str(form.get("to", "")).strip()
        where = f"to {to}" if to else "each to the queue it failed in"
        what = f"{len(ids)} job(s)" if ids else f"up to {BULK_MAX} waiting jobs"
        return f"Redrive {what} of dead-letter queue {queue}, {where}."
    if ids:
        return f"{action.capitalize()} {len(ids)} job(s) of queue {queue or '(each its own)'}."
    which = {
        "retry": "failed",
        "cancel": "created and retry",
        "resume": "cancelled",
        "delete": str(form.get("state", "")) or "(no state given)",
    }[action]
    return f"{action.capitalize()} up to {BULK_MAX} {which} jobs of queue {queue}."


_QUEUE_WIDE = {"retry": ["failed"], "cancel": ["created", "retry"], "resume": ["cancelled"]}
"""The states a queue-wide action takes its jobs from (delete: the state chosen)."""


def _run_action(
    action: str, ids: list[uuid.UUID], queue: str, form: Any
) -> Callable[[QueueService], str]:
    def work(q: QueueService) -> str:
        if action == "redrive":
            if not queue:
                raise BadRequest("redrive needs the dead-letter queue (queue)")
            to = str(form.get("to", "")).strip() or None
            moved = q.redrive(queue, to, ids or None, limit=BULK_MAX)
            return f"redrove {len(moved)} job(s) out of {queue}"
        targets: dict[str, list[uuid.UUID]] = {}
        if ids:
            if queue:
                targets[queue] = ids
            else:
                for info in q.get_queues():
                    for job in q.get_jobs(info.name, ids):
                        targets.setdefault(info.name, []).append(job.id)
        else:
            states = _QUEUE_WIDE.get(action) or [str(form.get("state", ""))]
            if states == [""] or not all(s in STATES for s in states):
                raise BadRequest("a queue-wide delete needs a known state (state)")
            for state in states:
                page = q.find_jobs(queue, state=state, limit=BULK_MAX)
                targets.setdefault(queue, []).extend(j.id for j in page.jobs)
        done = 0
        for name, chosen in targets.items():
            if not chosen:
                continue
            if action == "retry":
                done += len(q.retry(name, chosen).affected)
            elif action == "cancel":
                done += len(q.cancel(name, chosen).affected)
            elif action == "resume":
                done += len(q.resume(name, chosen).affected)
            else:
                done += len(q.delete_jobs(name, chosen).affected)
        past = {"retry": "retried", "cancel": "cancelled", "resume": "resumed", "delete": "deleted"}
        return f"{past[action]} {done} job(s)"

    return work


async def action(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(request.path_params["action"])
    if name not in ACTIONS:
        raise HTTPException(404, f"no action {shown(name)}: one of {', '.join(ACTIONS)}")
    ids, queue = _action_targets(name, form)
    root = d._root(request)
    fallback = (
        f"{root}/s/{segment(schema)}/jobs/{ids[0]}"
        + (f"?{urlencode({'queue': queue})}" if queue else "")
        if len(ids) == 1 and name != "delete"
        else f"{root}/s/{segment(schema)}/queues/{in_path(queue)}"
        if queue
        else f"{root}/s/{segment(schema)}/jobs"
    )
    target = safe_next(root, str(form.get("next", "")), fallback)
    if form.get("confirm") != "yes":
        fields = [(k, str(v)) for k, v in form.multi_items() if k not in ("csrf_token", "confirm")]
        matching = None
        if not ids and name != "redrive":
            # A queue-wide action: how many jobs it would touch now.
            wanted = _QUEUE_WIDE[name] if name != "delete" else [str(form.get("state"))]
            counts = await d.read(schema, lambda q: q.count_jobs([queue]))
            matching = sum(counts[0].counts[s] for s in wanted) if counts else 0
        return d.render(
            request,
            "confirm.html",
            schema=schema,
            action=name,
            description=_describe(name, ids, queue, form),
            fields=fields,
            ids=ids,
            matching=matching,
            bulk_max=BULK_MAX,
            back=target,
        )
    message = await d.write(schema, _run_action(name, ids, queue, form))
    if name == "delete" and target.startswith(f"{root}/s/{segment(schema)}/jobs/"):
        target = fallback if len(ids) != 1 else f"{root}/s/{segment(schema)}/jobs"
    response = RedirectResponse(target, status_code=303)
    d.set_flash(response, request, message)
    return response


_INT_OPTIONS = (
    "retry_limit",
    "retry_delay",
    "retry_delay_max",
    "expire_seconds",
    "retention_seconds",
    "deletion_seconds",
    "warning_queued",
    "heartbeat_seconds",
)


async def save_queue(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(form.get("name", "")).strip()
    mode = str(form.get("mode", "create"))
    if mode not in ("create", "update"):
        raise BadRequest(f"mode: {shown(mode)} is not create or update")
    options: dict[str, Any] = {}
    for option in _INT_OPTIONS:
        raw = str(form.get(option, "")).strip()
        if raw:
            try:
                options[option] = int(raw)
            except ValueError:
                raise BadRequest(f"{option}: {shown(raw)} is not a whole number") from None
    dead_letter = str(form.get("dead_letter", "")).strip()
    if dead_letter:
        options["dead_letter"] = dead_letter
    if "retry_backoff" in form:
        options["retry_backoff"] = form.get("retry_backoff") == "on"
    policy = str(form.get("policy", "")).strip()
    if mode == "create" and policy:
        options["policy"] = policy

    def work(q: QueueService) -> str:
        if mode == "update":
            q.update_queue(name, **options)
            return f"updated queue {name}"
        q.create_queue(name, exist_ok=False, **options)
        return f"created queue {name}"

    message = await d.write(schema, work)
    response = RedirectResponse(
        f"{d._root(request)}/s/{segment(schema)}/queues/{in_path(name)}", status_code=303
    )
    d.set_flash(response, request, message)
    return response


async def send_job(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(form.get("queue", "")).strip()
    raw = str(form.get("data", "")).strip()
    if len(raw) > SEND_MAX:
        raise BadRequest(f"data: at most {SEND_MAX:,} characters of JSON here, not {len(raw):,}")
    try:
        data = json.loads(raw) if raw else None
    except RecursionError:
        raise BadRequest("data is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer over Python's digit limit
        raise BadRequest(f"data is not valid JSON: {exc}") from None
    options: dict[str, Any] = {}
    key = str(form.get("singleton_key", "")).strip()
    if key:
        options["singleton_key"] = key
    job_id = await d.write(schema, lambda q: q.send(name, data, **options))
    root = d._root(request)
    if job_id is None:
        response = RedirectResponse(
            f"{root}/s/{segment(schema)}/queues/{in_path(name)}", status_code=303
        )
        d.set_flash(response, request, "the queue's policy did not accept the job")
    else:
        response = RedirectResponse(
            f"{root}/s/{segment(schema)}/jobs/{job_id}?{urlencode({'queue': name})}",
            status_code=303,
        )
        d.set_flash(response, request, f"sent job {job_id}")
    return response
