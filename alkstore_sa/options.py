"""Queue and send options: the option table and the checks derived from it, done in
Python before any SQL runs.

Each option is declared once in :data:`OPTIONS` (see the "Architecture" page,
"Options"); validation, the send statement's inputs, the pg-boss JSON mappings, the
command line's flags and inline mode's defaults are derived from it. The typed options
below are written out for type checkers; a test keeps their keys equal to the table's.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict

from . import limits, versions
from .errors import InvalidOptionsError, shown
from .models.enums import QueuePolicy
from .names import queue_ref

INT32_MAX = 2_147_483_647
EXPIRE_MAX = 86_399  # pg-boss: expireInSeconds must be below 24 hours


class QueueOptions(TypedDict, total=False):
    """Options of :meth:`~alkstore_sa.QueueService.create_queue` (all optional)."""

    policy: QueuePolicy | str
    partition: bool
    dead_letter: str | None
    retry_limit: int
    retry_delay: int
    retry_backoff: bool
    retry_delay_max: int | None
    expire_seconds: int
    retention_seconds: int
    deletion_seconds: int
    warning_queued: int
    heartbeat_seconds: int | None
    notify: bool


class TimedSendOptions(TypedDict, total=False):
    """The options of :class:`SendOptions` other than ``start_after``."""

    id: uuid.UUID | str
    priority: int
    singleton_key: str
    singleton_seconds: int
    expire_seconds: int
    retention_seconds: int
    deletion_seconds: int
    retry_limit: int
    retry_delay: int
    retry_backoff: bool
    retry_delay_max: int
    dead_letter: str
    heartbeat_seconds: int
    group_id: str
    group_tier: str


class SendOptions(TimedSendOptions, total=False):
    """Per-job options of :meth:`~alkstore_sa.QueueService.send` (all optional).

    Each one overrides the queue's value for this job only.
    """

    start_after: dt.datetime | dt.timedelta | int | float | str


class UpdateOptions(TypedDict, total=False):
    """Options :meth:`~alkstore_sa.QueueService.update` and
    :meth:`~alkstore_sa.QueueService.upsert` may set on a job (all optional)."""

    priority: int
    start_after: dt.datetime | dt.timedelta | int | float | str
    retention_seconds: int
    expire_seconds: int
    deletion_seconds: int
    retry_limit: int
    retry_delay: int
    retry_backoff: bool
    retry_delay_max: int | None
    dead_letter: str | None
    heartbeat_seconds: int | None


class JobSpec(SendOptions, total=False):
    """One job of :meth:`~alkstore_sa.QueueService.send_many`: its data plus options."""

    data: Any


class FlowJob(TypedDict, total=False):
    """One job of :meth:`~alkstore_sa.QueueService.flow` (pg-boss's ``FlowJob``).

    ``ref`` (required) names the job within the flow, and the dict the flow returns
    maps it to the job's id; ``name`` (required) is its queue; ``data`` and
    ``options`` (any :class:`SendOptions`) are those of
    :meth:`~alkstore_sa.QueueService.send`; ``depends_on`` lists the refs of the
    jobs it waits for: it stays blocked until every one of them has completed.
    """

    ref: Required[str]
    name: Required[str]
    data: Any
    options: SendOptions
    depends_on: Sequence[str]


KIND_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "bool": (bool,),
    "text": (str,),
    "queue": (str,),
    "policy": (QueuePolicy, str),
    "uuid": (uuid.UUID, str),
    "when": (dt.datetime, dt.timedelta, int, float, str),
}
"""The Python types of each kind of option value (see :class:`OptionSpec`)."""


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One queue or send option, declared once: validation, the send statement, the
    pg-boss JSON mappings, the command line and inline mode are derived from it.

    :param name: our keyword (``retry_limit``).
    :param kind: the value's kind, which picks its check: ``int`` (within
        ``minimum``..``maximum``), ``bool``, ``text`` (at most ``max_bytes``),
        ``queue`` (a queue name), ``policy``, ``uuid`` or ``when`` (``start_after``).
    :param queue: an option of ``create_queue``; ``updatable`` says whether
        ``update_queue`` may change it.
    :param send: an option of ``send``.
    :param public: part of the public API (``False``: accepted by ``send`` for
        internal callers, absent from the typed options and the command line).
    :param nullable: ``None`` is accepted (unset, or cleared by ``update_queue``).
    :param pgboss: the key in pg-boss's ``createQueue``/``send`` options objects.
    :param job_column: the job column the value is stored in as it is (``None``
        when the job stores something derived from it, or nothing).
    :param queue_column: the queue column holding the queue's value.
    :param fallback: a job sent without it takes the queue's value, as pg-boss
        derives its job columns.
    :param default: pg-boss's default: a queue created without the option gets it,
        and so does a job in inline mode.
    :param requires: ``(option, value)`` that must hold whenever this option is set.
    :param since: the first pg-boss schema version that has the option; on an older
        schema it is refused before any SQL (see :func:`check_version`).
    :param minimum_26: the lowest value at schema 26 when it is above ``minimum``
        (a value whose meaning is new at 46, like ``deletion_seconds=0``).
    :param metavar: the command line's placeholder for the value.
    :param help: the command line's help.
    :param allow_empty: a ``text`` value may be the empty string.
    """

    name: str
    kind: str
    queue: bool = False
    send: bool = False
    public: bool = True
    updatable: bool = True
    nullable: bool = False
    minimum: int = 0
    maximum: int = INT32_MAX
    max_bytes: int | None = None
    pgboss: str = ""
    job_column: str | None = None
    queue_column: str | None = None
    fallback: bool = False
    default: Any = None
    requires: tuple[str, Any] | None = None
    since: int = 26
    minimum_26: int | None = None
    metavar: str | None = None
    help: str = ""
    allow_empty: bool = True

    @property
    def python_types(self) -> tuple[type, ...]:
        """The Python types a value of this option may have (before its checks)."""
        return KIND_TYPES[self.kind]

    @property
    def flag(self) -> str:
        """The command line flag (``--retry-limit``)."""
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "id",
        "uuid",
        send=True,
        nullable=True,
        pgboss="id",
        job_column="id",
        metavar="UUID",
        help="the job's id (default: generated)",
    ),
    OptionSpec(
        "priority",
        "int",
        send=True,
        minimum=-INT32_MAX - 1,
        pgboss="priority",
        job_column="priority",
        default=0,
        metavar="N",
        help="higher runs first (default 0)",
    ),
    OptionSpec(
        "start_after",
        "when",
        send=True,
        nullable=True,
        pgboss="startAfter",
        metavar="WHEN",
        help="seconds from now, or an ISO-8601 time with offset",
    ),
    OptionSpec(
        "singleton_key",
        "text",
        send=True,
        nullable=True,
        max_bytes=limits.MAX_SINGLETON_KEY_BYTES,
        pgboss="singletonKey",
        job_column="singleton_key",
        metavar="KEY",
        help="policy/throttle key",
    ),
    OptionSpec(
        "singleton_seconds",
        "int",
        send=True,
        minimum=1,
        pgboss="singletonSeconds",
        metavar="SECONDS",
        help="throttle: one job per key per slot of this length",
    ),
    # The next slot of a throttle: debounce sends with it when the current slot is
    # taken (pg-boss's internal singletonOffset).
    OptionSpec(
        "singleton_offset",
        "int",
        send=True,
        public=False,
        minimum=-INT32_MAX - 1,
        pgboss="singletonOffset",
    ),
    OptionSpec(
        "policy",
        "policy",
        queue=True,
        updatable=False,
        pgboss="policy",
        queue_column="policy",
        default="standard",
        help="how jobs sharing a singleton key are limited (default standard)",
    ),
    OptionSpec(
        "partition",
        "bool",
        queue=True,
        updatable=False,
        pgboss="partition",
        queue_column="partition",
        default=False,
        help="give the queue its own partition table",
    ),
    OptionSpec(
        "dead_letter",
        "queue",
        queue=True,
        send=True,
        nullable=True,
        pgboss="deadLetter",
        job_column="dead_letter",
        queue_column="dead_letter",
        fallback=True,
        metavar="QUEUE",
        help="queue for failed jobs",
    ),
    OptionSpec(
        "warning_queued",
        "int",
        queue=True,
        pgboss="warningQueueSize",
        queue_column="warning_queued",
        default=0,
        metavar="N",
        help="queued jobs that raise a warning (0 = global)",
    ),
    OptionSpec(
        "retry_limit",
        "int",
        queue=True,
        send=True,
        pgboss="retryLimit",
        job_column="retry_limit",
        queue_column="retry_limit",
        fallback=True,
        default=2,
        metavar="N",
        help="attempts after the first",
    ),
    OptionSpec(
        "retry_delay",
        "int",
        queue=True,
        send=True,
        pgboss="retryDelay",
        job_column="retry_delay",
        queue_column="retry_delay",
        fallback=True,
        default=0,
        metavar="SECONDS",
        help="seconds between attempts",
    ),
    OptionSpec(
        "retry_backoff",
        "bool",
        queue=True,
        send=True,
        pgboss="retryBackoff",
        job_column="retry_backoff",
        queue_column="retry_backoff",
        fallback=True,
        default=False,
        help="grow the delay on each retry",
    ),
    # As pg-boss: the cap is only meaningful next to the backoff it caps.
    OptionSpec(
        "retry_delay_max",
        "int",
        queue=True,
        send=True,
        nullable=True,
        pgboss="retryDelayMax",
        job_column="retry_delay_max",
        queue_column="retry_delay_max",
        fallback=True,
        requires=("retry_backoff", True),
        metavar="SECONDS",
        help="cap of the backoff",
    ),
    OptionSpec(
        "expire_seconds",
        "int",
        queue=True,
        send=True,
        minimum=1,
        maximum=EXPIRE_MAX,
        pgboss="expireInSeconds",
        job_column="expire_seconds",
        queue_column="expire_seconds",
        fallback=True,
        default=900,
        metavar="SECONDS",
        help="lease of an active job",
    ),
    # A job stores keep_until, counted from its start_after, not the seconds.
    OptionSpec(
        "retention_seconds",
        "int",
        queue=True,
        send=True,
        minimum=1,
        pgboss="retentionSeconds",
        queue_column="retention_seconds",
        fallback=True,
        default=1_209_600,
        metavar="SECONDS",
        help="how long a queued job may wait",
    ),
    # 0 keeps finished jobs forever from schema 46 on (pg-boss 12's supervisor
    # skips them); pg-boss 11 refused 0, and our supervisor at 26 would delete
    # such jobs at once, so 26 still asks for at least a second.
    OptionSpec(
        "deletion_seconds",
        "int",
        queue=True,
        send=True,
        minimum=0,
        minimum_26=1,
        pgboss="deleteAfterSeconds",
        job_column="deletion_seconds",
        queue_column="deletion_seconds",
        fallback=True,
        default=604_800,
        metavar="SECONDS",
        help="how long a finished job is kept (0 = keep, schema 46 only)",
    ),
    # pg-boss 12: a running job's heartbeat_on must move within this many seconds,
    # or the supervisor fails it; pg-boss refuses less than 10. NULL: no heartbeat.
    OptionSpec(
        "heartbeat_seconds",
        "int",
        queue=True,
        send=True,
        nullable=True,
        minimum=10,
        pgboss="heartbeatSeconds",
        job_column="heartbeat_seconds",
        queue_column="heartbeat_seconds",
        fallback=True,
        since=46,
        metavar="SECONDS",
        help="heartbeat a running job must keep (schema 46 only)",
    ),
    # pg-boss 12: sends into the queue NOTIFY Node's channel, so listening
    # workers wake at once instead of at their next poll.
    OptionSpec(
        "notify",
        "bool",
        queue=True,
        pgboss="notify",
        queue_column="notify",
        default=False,
        since=46,
        help="wake listening workers on each send (schema 46 only)",
    ),
    # pg-boss 12: the job's concurrency group (its send option group.id), which a
    # worker's group_concurrency limits; pg-boss refuses an empty one.
    OptionSpec(
        "group_id",
        "text",
        send=True,
        nullable=True,
        allow_empty=False,
        max_bytes=limits.MAX_GROUP_ID_BYTES,
        pgboss="group.id",
        job_column="group_id",
        since=46,
        metavar="GROUP",
        help="concurrency group of the job (schema 46 only)",
    ),
    # pg-boss 12: group.tier picks the group's limit among a worker's tiers; only
    # given with a group.
    OptionSpec(
        "group_tier",
        "text",
        send=True,
        nullable=True,
        allow_empty=False,
        max_bytes=limits.MAX_GROUP_TIER_BYTES,
        pgboss="group.tier",
        job_column="group_tier",
        since=46,
        metavar="TIER",
        help="tier of the job's group, with --group-id (schema 46 only)",
    ),
)
"""Every queue and send option, once; see :class:`OptionSpec`."""

OPTION = {o.name: o for o in OPTIONS}
"""The options of :data:`OPTIONS` by name."""

INLINE_DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS if o.send and o.public}
"""The value a job takes for each send option not given, in inline mode (pg-boss's defaults)."""

QUEUE_OPTION_NAMES = frozenset(o.name for o in OPTIONS if o.queue)
"""The keywords of ``create_queue``."""
UPDATABLE_QUEUE_OPTIONS = frozenset(o.name for o in OPTIONS if o.queue and o.updatable)
"""The keywords of ``update_queue``."""
SEND_OPTION_NAMES = frozenset(o.name for o in OPTIONS if o.send and o.public)
"""The keywords of ``send``."""
ACCEPTED_SEND_OPTIONS = frozenset(o.name for o in OPTIONS if o.send)
"""What ``send`` accepts: its keywords and the slot offset debounce sends with."""


def check_int(option: str, value: object, *, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionsError(option, f"must be an integer, not {shown(value)}")
    if value < minimum or value > maximum:
        raise InvalidOptionsError(option, f"must be between {minimum} and {maximum}, not {value}")
    return value


def check_bool(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionsError(option, f"must be True or False, not {shown(value)}")
    return value


def check_text(
    option: str, value: object, *, allow_empty: bool = True, max_bytes: int | None = None
) -> str:
    """A string PostgreSQL can store in a ``text`` column: no NUL character, valid
    UTF-8 and, with ``max_bytes``, at most that many bytes once encoded (the limit of
    a value that enters an index, see :mod:`alkstore_sa.limits`)."""
    if not isinstance(value, str):
        raise InvalidOptionsError(option, f"must be a string, not {shown(value)}")
    if not value and not allow_empty:
        raise InvalidOptionsError(option, "must be a non-empty string")
    if "\x00" in value:
        raise InvalidOptionsError(option, "must not contain the character U+0000")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOptionsError(option, "contains a lone surrogate, not valid UTF-8") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidOptionsError(
            option, f"must be at most {max_bytes} bytes in UTF-8, not {size} bytes"
        )
    return value


def check_unknown(given: Mapping[str, object], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise InvalidOptionsError(
            unknown[0], f"unknown {what} option (allowed: {', '.join(sorted(allowed))})"
        )


def _policy(value: object) -> str:
    try:
        return QueuePolicy(value if isinstance(value, str) else repr(value)).value
    except ValueError:
        raise InvalidOptionsError(
            "policy", f"{shown(value)} is not one of " + ", ".join(p.value for p in QueuePolicy)
        ) from None


def _checker(spec: OptionSpec) -> Callable[[object], Any]:
    """The check of ``spec``'s values, chosen once from its kind (sends check many jobs)."""
    name = spec.name
    check: Callable[[object], Any]
    if spec.kind == "when":
        return start_after
    if spec.kind == "int":
        lo, hi = spec.minimum, spec.maximum
        check = functools.partial(check_int, name, minimum=lo, maximum=hi)
    elif spec.kind == "bool":
        check = functools.partial(check_bool, name)
    elif spec.kind == "text":
        check = functools.partial(
            check_text, name, allow_empty=spec.allow_empty, max_bytes=spec.max_bytes
        )
    elif spec.kind == "queue":
        check = functools.partial(queue_ref, option=name)
    elif spec.kind == "policy":
        check = _policy
    elif spec.kind == "uuid":
        check = job_id
    else:
        raise AssertionError(f"option {shown(name)} has an unknown kind {shown(spec.kind)}")
    if spec.nullable:
        strict = check
        return lambda value: None if value is None else strict(value)
    return check


def check_option(name: str, value: object) -> Any:
    """``value`` checked against the rules of option ``name``; returns it normalised
    (a policy as its text, an id as a UUID, ``start_after`` as :class:`StartAfter`)."""
    return _CHECKS[name](value)


_RULED = tuple(o for o in OPTIONS if o.requires is not None)


def check_requirements(values: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> None:
    """The rules between options (``requires`` in :data:`OPTIONS`), on ``values``
    over ``base``: the values an option not in ``values`` takes (a queue's current
    ones for ``update_queue``; none for ``create_queue`` and ``send``)."""
    for spec in _RULED:
        assert spec.requires is not None
        if values.get(spec.name, (base or {}).get(spec.name)) is None:
            continue
        other, wanted = spec.requires
        if values.get(other, (base or {}).get(other)) != wanted:
            raise InvalidOptionsError(spec.name, f"is only allowed with {other}={shown(wanted)}")


def check_options(given: Mapping[str, Any], allowed: frozenset[str], what: str) -> dict[str, Any]:
    """Each option of ``given`` checked (unknown ones refused, naming ``what``
    accepts them); returns the normalised values. The rules between options are
    left to :func:`check_requirements`."""
    check_unknown(given, allowed, what)
    return {key: _CHECKS[key](value) for key, value in given.items()}


def check_version(values: Mapping[str, Any], version: int | None, what: str) -> None:
    """Refuse the options of ``values`` the schema at ``version`` does not have, and
    values it gives no meaning to (``minimum_26``); ``what`` names the kind of
    option (``queue``, ``send``). ``None``: no schema (inline mode), nothing refused.
    """
    if version is None:
        return
    for key, value in values.items():
        spec = OPTION[key]
        if spec.since > version:
            raise InvalidOptionsError(
                key,
                f"needs pg-boss schema {spec.since} (a {what} option of pg-boss 12); "
                f"this schema is at {version}",
            )
        if (
            spec.minimum_26 is not None
            and not versions.has(version, "deletion_seconds 0 (keep forever)")
            and isinstance(value, int)
            and value < spec.minimum_26
        ):
            raise InvalidOptionsError(
                key,
                f"must be at least {spec.minimum_26} at schema {version}, not {value} "
                f"({value} is allowed from pg-boss schema "
                f"{versions.since('deletion_seconds 0 (keep forever)')} on)",
            )


def queue_options(
    name: str, opts: Mapping[str, Any], *, update: bool = False, version: int | None = None
) -> dict[str, Any]:
    """Validate the options of ``create_queue`` (``update_queue`` with ``update``)
    for a schema at ``version`` (see :func:`check_version`); returns a normalised copy.

    For an update, the rules between options also depend on the queue's current
    values: the caller checks them with :func:`check_requirements` once it has read it.
    """
    if update:
        out = check_options(opts, UPDATABLE_QUEUE_OPTIONS, "update_queue")
    else:
        out = check_options(opts, QUEUE_OPTION_NAMES, "queue")
        check_requirements(out)
    check_version(out, version, "queue")
    if out.get("dead_letter") is not None and out["dead_letter"] == name:
        raise InvalidOptionsError("dead_letter", "a queue cannot be its own dead letter queue")
    return out


def send_options(opts: Mapping[str, Any], *, version: int | None = None) -> dict[str, Any]:
    """Validate the options of one job of ``send`` for a schema at ``version`` (see
    :func:`check_version`); returns a normalised copy (``start_after`` as
    :class:`StartAfter`, ``id`` as a UUID)."""
    out = check_options(opts, ACCEPTED_SEND_OPTIONS, "send")
    check_requirements(out)
    if out.get("group_tier") is not None and out.get("group_id") is None:
        # pg-boss's tier lives inside its group object: no group, no tier.
        raise InvalidOptionsError("group_tier", "is only allowed with a group_id")
    check_version(out, version, "send")
    return out


def pgboss_queue_json(name: str, opts: Mapping[str, Any]) -> dict[str, Any]:
    """The options object the ``create_queue`` SQL function reads (pg-boss's names)."""
    out = {OPTION[k].pgboss: v for k, v in opts.items() if v is not None}
    out.setdefault(OPTION["policy"].pgboss, OPTION["policy"].default)
    return out


def encode_json(option: str, value: Any) -> str | None:
    """JSON text for a jsonb column, or ``None`` for SQL NULL.

    Raises :class:`InvalidOptionsError` for what JSON or jsonb cannot hold, for
    nesting deeper than :data:`~alkstore_sa.limits.MAX_JSON_DEPTH` and for text
    longer than :data:`~alkstore_sa.limits.MAX_PAYLOAD_BYTES`.
    """
    if value is None:
        return None
    # Checked before encoding, without recursion: data nested past the limit could
    # be encoded, but a worker's decoder would then fail on it at every fetch.
    if json_depth_exceeds(value, limits.MAX_JSON_DEPTH):
        raise InvalidOptionsError(
            option,
            f"nests arrays and objects deeper than {limits.MAX_JSON_DEPTH} levels "
            "(or contains itself)",
        )
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOptionsError(option, f"cannot be encoded as JSON: {exc}") from None
    # jsonb refuses what JSON allows in two places; caught here, because an error
    # from PostgreSQL would abort the caller's transaction.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidOptionsError(option, "jsonb cannot store the character U+0000")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOptionsError(option, "contains a lone surrogate, not valid UTF-8") from None
    if size > limits.MAX_PAYLOAD_BYTES:
        raise InvalidOptionsError(
            option,
            f"is {size} bytes as JSON, more than the limit of {limits.MAX_PAYLOAD_BYTES} "
            "(store large content elsewhere and send a reference to it)",
        )
    return text


def encode_json_array(values: Sequence[Any]) -> str | None:
    """The JSON array of ``values`` as one text, each element exactly the text
    :func:`encode_json` gives it (``null`` for ``None``); ``None`` when some
    element would be refused, so that the caller encodes them one by one to learn
    which and why.

    One call to the encoder for a whole batch, where encoding element by element
    costs a few microseconds of calls each.
    """
    # Checked first, as encode_json does; an element that is a scalar or an object
    # of scalars (one level) needs no walk.
    for value in values:
        if type(value) is dict:
            for member in value.values():
                if isinstance(member, _CONTAINERS):
                    break
            else:
                continue
        elif not isinstance(value, _CONTAINERS):
            continue
        if json_depth_exceeds(value, limits.MAX_JSON_DEPTH):
            return None
    try:
        text = json.dumps(values, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        return None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            return None
    # No element is larger than the whole array without its brackets; when the
    # whole is past the limit, an element may be too.
    if size - 2 > limits.MAX_PAYLOAD_BYTES:
        return None
    return text


_CONTAINERS = (dict, list, tuple)


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Does ``value`` nest dicts, lists and tuples more than ``limit`` levels deep?

    ``[]`` is one level, ``[[]]`` two. The walk keeps its own stack, so it works at any
    depth, and stops at the first path past the limit (a value that contains itself
    is infinitely deep).
    """
    if not isinstance(value, _CONTAINERS):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
    return False


# \u0000 preceded by an even number of backslashes is an escaped NUL (an odd
# number means the backslash itself was escaped).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def error_output(exc: BaseException) -> dict[str, Any]:
    """The ``{name, message, stack}`` object stored as a failed job's output."""
    return {
        "name": type(exc).__name__,
        "message": str(exc),
        "stack": "".join(traceback.format_exception(exc)),
    }


def output_value(value: Any) -> Any:
    """Map a handler result or error to the stored output, as pg-boss does.

    ``None`` stays NULL, a mapping is stored as it is, an exception becomes
    ``{name, message, stack}`` and anything else is wrapped as ``{"value": ...}``.
    """
    if value is None:
        return None
    if isinstance(value, BaseException):
        return error_output(value)
    if isinstance(value, Mapping):
        return dict(value)
    return {"value": value}


# Bounds that keep start_after and every timestamp derived from it (keep_until =
# start_after + retention) inside what both PostgreSQL and Python's datetime can
# hold, in UTC and in any session time zone: a job out of range would break every
# statement that returns it. See alkstore_sa/limits.py.
_EARLIEST_START = limits.EARLIEST_START
_LATEST_START = limits.LATEST_START
_LONGEST_WAIT = limits.LONGEST_WAIT


def in_utc(option: str, value: object) -> dt.datetime:
    """An aware datetime ``value`` converted to UTC, or InvalidOptionsError naming ``option``.

    Every time bound to a statement goes through here: PostgreSQL refuses a UTC
    offset of 16 hours or more in a ``timestamptz`` (Python allows up to 23:59),
    which would reach the server as a raw error and spoil the caller's transaction.
    A time that leaves Python's range once in UTC (``datetime.max`` west of UTC,
    ``datetime.min`` east of it) is refused.
    """
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        raise InvalidOptionsError(option, f"must be a timezone-aware datetime, not {shown(value)}")
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidOptionsError(
            option, f"{value.isoformat()} is outside Python's datetime range in UTC"
        ) from None


@dataclass(frozen=True, slots=True)
class StartAfter:
    absolute: dt.datetime | None
    relative: dt.timedelta | None


def start_after(value: object) -> StartAfter:
    """Normalise ``start_after``: aware datetime, timedelta, seconds, or ISO-8601 text.

    Relative values are added to the database clock, not the local one.
    """
    if value is None:
        return StartAfter(None, None)
    if isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            raise InvalidOptionsError("start_after", "a datetime must be timezone-aware")
        # Aware datetimes compare by their UTC instant, without converting (which
        # would overflow at year 1 east of UTC or year 9999 west of it).
        if value < _EARLIEST_START:
            raise InvalidOptionsError(
                "start_after",
                f"must not be before {_EARLIEST_START.isoformat()} in UTC, not {value.isoformat()}",
            )
        if value >= _LATEST_START:
            raise InvalidOptionsError(
                "start_after",
                f"must be before {_LATEST_START.isoformat()} in UTC, not {value.isoformat()}",
            )
        # In UTC: PostgreSQL refuses an offset of 16 hours or more (Python allows
        # 23:59), and the bounds above keep the conversion inside Python's range.
        return StartAfter(value.astimezone(dt.UTC), None)
    if isinstance(value, dt.timedelta):
        if value > _LONGEST_WAIT:
            raise InvalidOptionsError("start_after", f"must be at most {_LONGEST_WAIT.days} days")
        return StartAfter(None, value if value > dt.timedelta(0) else None)
    if isinstance(value, bool):
        raise InvalidOptionsError("start_after", f"unsupported value {shown(value)}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidOptionsError("start_after", f"must be finite, not {shown(value)}")
        if value > _LONGEST_WAIT.total_seconds():
            raise InvalidOptionsError(
                "start_after", f"must be at most {_LONGEST_WAIT.total_seconds():.0f} seconds"
            )
        return StartAfter(None, dt.timedelta(seconds=value) if value > 0 else None)
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return start_after(seconds)
        try:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidOptionsError(
                "start_after", f"{shown(value)} is neither a number of seconds nor an ISO-8601 time"
            ) from None
        return start_after(parsed)
    raise InvalidOptionsError("start_after", f"unsupported type {type(value).__name__}")


def job_id(value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidOptionsError("id", f"{shown(value)} is not a UUID")


def job_ids(ids: object) -> list[uuid.UUID]:
    """Accept one id or an iterable of ids."""
    if isinstance(ids, uuid.UUID | str):
        return [job_id(ids)]
    if isinstance(ids, list | tuple | set | frozenset):
        return [job_id(i) for i in ids]
    raise InvalidOptionsError("ids", f"expected a UUID or a list of UUIDs, not {shown(ids)}")


PGBOSS_SEND_KEYS = {o.pgboss: o.name for o in OPTIONS if o.send and o.public}
"""pg-boss's send option keys and ours, for options stored where Node reads them.

A dotted key (``group.id``) is a field of an object option of pg-boss's (``group``)."""


def pgboss_start_after(value: object) -> str | int | float | None:
    """``start_after`` in a form Node pg-boss's send accepts.

    pg-boss casts text ending in ``Z`` to a timestamp and anything else to an
    interval, so absolute times become UTC ISO text with a ``Z`` and relative
    ones a number of seconds.
    """
    when = start_after(value)
    if when.absolute is not None:
        utc = when.absolute.astimezone(dt.UTC).replace(tzinfo=None)
        return utc.isoformat(timespec="milliseconds") + "Z"
    if when.relative is not None:
        secs = when.relative.total_seconds()
        return int(secs) if secs.is_integer() else secs
    return None


def to_pgboss_send_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """Our send options in pg-boss's names and value forms, to store where Node reads them."""
    out: dict[str, Any] = {}
    for key, value in opts.items():
        spec = OPTION[key]
        if spec.kind == "when":
            value = pgboss_start_after(value)
            if value is None:
                continue
        elif spec.kind == "uuid":
            value = str(value)
        outer, _, inner = spec.pgboss.partition(".")
        if inner:
            if value is not None:
                out.setdefault(outer, {})[inner] = value
        else:
            out[spec.pgboss] = value
    return out


def from_pgboss_send_options(opts: Mapping[str, Any] | None) -> dict[str, Any]:
    """Send options stored by Node pg-boss or by us, in our names (unknown keys dropped)."""
    flat: dict[str, Any] = {}
    for key, value in (opts or {}).items():
        if isinstance(value, Mapping):
            # pg-boss's object options (group: {id, tier}) as their dotted keys.
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return {
        PGBOSS_SEND_KEYS[key]: value
        for key, value in flat.items()
        if key in PGBOSS_SEND_KEYS and value is not None
    }


# Built last: the checks of some kinds are defined further down this module.
_CHECKS = {o.name: _checker(o) for o in OPTIONS}
