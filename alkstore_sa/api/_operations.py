"""The operations of the HTTP API: :class:`~alkstore_sa.QueueService` methods, each at
``/api/<method name>``, with its parameters as JSON fields (the "HTTP API" page).

An operation's arguments are the method's own parameters, by name, read from the JSON
body (``POST``) or the query string (``GET``, the methods that only read); the method's
``**options`` (queue or send options) are the ``options`` object, in our names or in
pg-boss's (``retryLimit`` for ``retry_limit``). Nothing is renamed or re-validated here:
each value goes to the service, which refuses bad input with its own
:class:`~alkstore_sa.InvalidOptionsError` before anything is written. What is checked
here is only what JSON cannot carry to Python as it is: an unknown field, a time given
as text, an option that would land on a parameter, and the size of a batch (every list
a request gives, and ``fetch``'s ``batch_size``; never the entries of a job's data).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .. import options as opt
from ..errors import InvalidOptionsError, shown
from ..records import Settlement
from ..service import QueueService
from ._schema import Schema, option_schema, schema_of

Call = Callable[[QueueService], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """One argument of an operation (a parameter of the service method)."""

    name: str
    hint: Any
    required: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Operation:
    """One endpoint: ``POST`` (or ``GET`` for a read) ``/api/<name>``."""

    name: str
    tag: str
    reads: bool
    """Only reads: ``GET`` with the arguments in the query string, allowed read-only."""
    params: tuple[Param, ...]
    options: Any
    """The TypedDict of the method's ``**options`` (``None``: it has none)."""
    summary: str
    description: str

    @property
    def method(self) -> str:
        return "get" if self.reads else "post"

    @property
    def path(self) -> str:
        return f"/api/{self.name}"

    @property
    def camel(self) -> str:
        """pg-boss's name of the same method (``sendAfter``), also routed."""
        head, *rest = self.name.split("_")
        return head + "".join(part.title() for part in rest)


# (method, tag): the service methods a remote client needs. Reads go over GET.
_EXPOSED: tuple[tuple[str, str], ...] = (
    ("create_queue", "queues"),
    ("update_queue", "queues"),
    ("delete_queue", "queues"),
    ("get_queue", "queues"),
    ("get_queues", "queues"),
    ("get_queue_stats", "queues"),
    ("count_jobs", "queues"),
    ("send", "jobs"),
    ("send_many", "jobs"),
    ("send_after", "jobs"),
    ("send_throttled", "jobs"),
    ("send_debounced", "jobs"),
    ("fetch", "jobs"),
    ("complete", "jobs"),
    ("fail", "jobs"),
    ("complete_many", "jobs"),
    ("fail_many", "jobs"),
    ("touch", "jobs"),
    ("extend_leases", "jobs"),
    ("cancel", "jobs"),
    ("resume", "jobs"),
    ("retry", "jobs"),
    ("delete_job", "jobs"),
    ("delete_jobs", "jobs"),
    ("get_job", "jobs"),
    ("get_jobs", "jobs"),
    ("find_jobs", "jobs"),
    ("get_job_attempts", "jobs"),
    ("redrive", "jobs"),
    ("flow", "flows"),
    ("get_dependencies", "flows"),
    ("get_dependents", "flows"),
    ("schedule", "schedules"),
    ("unschedule", "schedules"),
    ("get_schedules", "schedules"),
    ("publish", "events"),
    ("subscribe", "events"),
    ("unsubscribe", "events"),
    ("get_subscriptions", "events"),
)

_READS = re.compile(r"^(get_|find_|count_)")

# Parameters a JSON client cannot give (a cursor object of Python's): left out.
_LEFT_OUT = {("get_dependencies", "after"), ("get_dependents", "after")}


def _docs(method: Callable[..., Any]) -> tuple[str, str]:
    text = inspect.getdoc(method) or ""
    first, _, rest = text.partition("\n\n")
    clean = re.sub(r":(?:class|meth|func|data|attr|mod):`~?([^`]+)`", r"``\1``", rest)
    return " ".join(first.split()), clean.strip()


def _operation(name: str, tag: str) -> Operation:
    method = getattr(QueueService, name)
    hints = typing.get_type_hints(method, include_extras=True)
    params: list[Param] = []
    options: Any = None
    for p in list(inspect.signature(method).parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            (options,) = typing.get_args(hints[p.name])  # Unpack[SendOptions]
            continue
        if (name, p.name) in _LEFT_OUT:
            continue
        params.append(
            Param(
                p.name,
                hints[p.name],
                required=p.default is inspect.Parameter.empty,
            )
        )
    summary, description = _docs(method)
    return Operation(
        name, tag, bool(_READS.match(name)), tuple(params), options, summary, description
    )


OPERATIONS: tuple[Operation, ...] = tuple(_operation(n, t) for n, t in _EXPOSED)
"""Every endpoint of the API, in the order the OpenAPI document lists them."""

BY_NAME: dict[str, Operation] = {
    **{o.name: o for o in OPERATIONS},
    **{o.camel: o for o in OPERATIONS},
}
"""The operations by our name and by pg-boss's (``send_after``, ``sendAfter``)."""


# ------------------------------------------------------------------ arguments

# pg-boss's names of the queue and send options (``retryLimit``), and ours.
_PGBOSS_NAMES = {o.pgboss: o.name for o in opt.OPTIONS if o.pgboss and "." not in o.pgboss}


def _is_datetime(hint: Any) -> bool:
    return hint is dt.datetime or dt.datetime in typing.get_args(hint)


# A negative offset under a minute (``-00:00:00.5``), whose sign Python 3.11's
# fromisoformat drops.
_NEGATIVE_SECONDS = re.compile(r"-00:00:(\d\d(?:\.\d{1,6})?)$")


def _datetime(field: str, value: object) -> object:
    if not isinstance(value, str):
        return value  # the service says what is wrong with it
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidOptionsError(
            field, f"expected an ISO-8601 time with its offset, not {shown(value)}"
        ) from None
    negative = _NEGATIVE_SECONDS.search(value)
    if negative is not None and parsed.tzinfo is not None:
        offset = -dt.timedelta(seconds=float(negative.group(1)))
        parsed = parsed.replace(tzinfo=dt.timezone(offset))
    return parsed


def _options(operation: Operation, given: object) -> dict[str, Any]:
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise InvalidOptionsError("options", f"expected an object, not {shown(given)}")
    out: dict[str, Any] = {}
    for key, value in given.items():
        if not isinstance(key, str):
            raise InvalidOptionsError("options", f"a key must be text, not {shown(key)}")
        name = key if key in opt.OPTION else _PGBOSS_NAMES.get(key, key)
        if name in out:
            raise InvalidOptionsError("options", f"{key!r} given twice (in two spellings)")
        out[name] = value
    return out


def _takes_settlements(hint: Any) -> bool:
    """Whether ``hint`` is a sequence whose items may be :class:`Settlement`."""
    args = typing.get_args(hint)
    return bool(args) and Settlement in typing.get_args(args[0])


_SETTLEMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Settlement))


def _settle_item(field: str, item: object) -> object:
    """One item of ``complete_many``/``fail_many``/``extend_leases`` from JSON: an object
    ``{id, output, started_on}`` is a :class:`Settlement` (fenced on ``started_on``, the
    fetched job's), a pair ``[id, output]`` the tuple the service takes; an id stays."""
    if isinstance(item, dict):
        unknown = sorted(set(item) - _SETTLEMENT_FIELDS)
        if unknown or "id" not in item:
            raise InvalidOptionsError(
                field,
                f"an item is {{id, output, started_on}} (id required), not {shown(item)}",
            )
        started = _datetime(f"{field}.started_on", item.get("started_on"))
        return Settlement(item["id"], item.get("output"), started)  # type: ignore[arg-type]
    if isinstance(item, list) and len(item) == 2:
        return (item[0], item[1])
    return item


def _count(value: object) -> int:
    """The entries of a list argument; any other value (a job's data included) is no
    batch, however many entries it holds."""
    return len(value) if isinstance(value, list) else 0


# Arguments that ask for that many jobs at once: capped as a list is.
_BATCH_SIZES = frozenset({("fetch", "batch_size")})


def call_for(operation: Operation, args: Mapping[str, Any], max_batch: int) -> Call:
    """The service call ``args`` (the request's JSON fields) ask for, checked for what
    JSON cannot carry: an unknown field, a time as text, an option that names a
    parameter, a batch over ``max_batch`` (a list, or ``fetch``'s ``batch_size``)."""
    known = {p.name for p in operation.params} | ({"options"} if operation.options else set())
    unknown = sorted(set(args) - known)
    if unknown:
        raise InvalidOptionsError(
            unknown[0],
            f"{operation.name} takes no field {unknown[0]!r} (it takes: "
            f"{', '.join(sorted(known)) or 'nothing'})",
        )
    keywords: dict[str, Any] = {}
    for param in operation.params:
        if param.name not in args:
            if param.required:
                raise InvalidOptionsError(param.name, f"{operation.name} needs {param.name!r}")
            continue  # the method's default
        value = args[param.name]
        if _count(value) > max_batch:
            raise BatchTooLarge(param.name, _count(value), max_batch)
        if (
            (operation.name, param.name) in _BATCH_SIZES
            and isinstance(value, int)
            and value > max_batch
        ):
            raise BatchTooLarge(param.name, value, max_batch, asked=True)
        if _is_datetime(param.hint):
            value = _datetime(param.name, value)
        elif _takes_settlements(param.hint) and isinstance(value, list):
            value = [_settle_item(param.name, item) for item in value]
        keywords[param.name] = value
    method = getattr(QueueService, operation.name)
    options = _options(operation, args.get("options")) if operation.options else {}
    # Every name of the method's signature (``self``, a parameter left out here, the
    # ``**options`` name itself): an option by that name would land on it, or raise.
    clash = sorted(set(options) & (set(inspect.signature(method).parameters) | {"options"}))
    if clash:
        raise InvalidOptionsError(
            clash[0],
            f"{clash[0]!r} is not an option of {operation.name} (it names one of its parameters)",
        )

    def run(service: QueueService) -> Any:
        # Every parameter by its name, as the method declares it.
        return method(service, **keywords, **options)

    return run


def from_query(operation: Operation, query: Any) -> dict[str, Any]:
    """A ``GET`` operation's arguments from the query string (a Starlette
    ``QueryParams``): a list parameter repeats its name (``names=a&names=b``), an
    integer or a boolean (``true``/``false``) is read as one, the rest is text."""
    out: dict[str, Any] = {}
    params = {p.name: p for p in operation.params}
    for key in query:
        param = params.get(key)
        if param is None:
            out[key] = query[key]  # refused by call_for, which names what it takes
            continue
        values = query.getlist(key)
        kinds = _scalar_kinds(param.hint)
        if "array" in kinds:
            out[key] = values
            continue
        if len(values) != 1:
            raise InvalidOptionsError(key, f"give {key!r} once, not {len(values)} times")
        out[key] = _scalar(key, values[0], kinds)
    return out


def _scalar_kinds(hint: Any) -> set[str]:
    members = typing.get_args(hint) if typing.get_origin(hint) in _UNIONS else (hint,)
    kinds = set()
    for member in members:
        origin = typing.get_origin(member)
        if origin is not None and origin not in _UNIONS and member is not str:
            kinds.add("array")
        elif member is bool:
            kinds.add("bool")
        elif member is int:
            kinds.add("int")
    return kinds


def _scalar(key: str, value: str, kinds: set[str]) -> Any:
    if "bool" in kinds:
        if value not in ("true", "false"):
            raise InvalidOptionsError(key, f"expected true or false, not {shown(value)}")
        return value == "true"
    if "int" in kinds:
        try:
            return int(value)
        except ValueError:
            raise InvalidOptionsError(key, f"expected an integer, not {shown(value)}") from None
    return value


_UNIONS = (typing.Union, types.UnionType)


class BatchTooLarge(InvalidOptionsError):
    """A list in a request holds more entries than the API takes at once (HTTP 413)."""

    def __init__(self, field: str, count: int, limit: int, *, asked: bool = False) -> None:
        advice = f"ask for at most {limit}" if asked else f"send them in batches of at most {limit}"
        what = "jobs asked for" if asked else "entries"
        super().__init__(field, f"{count} {what}, over this API's batch limit of {limit}: {advice}")
        self.count = count
        self.limit = limit


# ------------------------------------------------------------------ schemas


def request_schema(operation: Operation, components: dict[str, Schema]) -> Schema:
    """The JSON body (``POST``) an operation takes."""
    properties: dict[str, Schema] = {}
    for param in operation.params:
        properties[param.name] = schema_of(param.hint, components, request=True)
    if operation.options is not None:
        properties["options"] = options_schema(operation.options)
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    required = [p.name for p in operation.params if p.required]
    if required:
        schema["required"] = required
    return schema


def options_schema(typed: Any) -> Schema:
    """The ``options`` object of an operation: each key of the TypedDict ``typed`` with
    its schema from the option table (pg-boss's spelling is accepted too)."""
    keys = typing.get_type_hints(typed)
    return {
        "type": "object",
        "properties": {k: option_schema(opt.OPTION[k]) for k in keys},
        "additionalProperties": False,
        "description": " ".join((typed.__doc__ or "").split("\n\n")[0].split())
        + " Each key also in pg-boss's spelling (retryLimit for retry_limit).",
    }


def response_schema(operation: Operation, components: dict[str, Schema]) -> Schema:
    hints = typing.get_type_hints(getattr(QueueService, operation.name))
    return schema_of(hints["return"], components)
