"""Validation of queue and send options, done in Python before any SQL runs."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from . import limits
from .errors import InvalidOptionsError
from .models.enums import QueuePolicy
from .names import validate_queue

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


class SendOptions(TimedSendOptions, total=False):
    """Per-job options of :meth:`~alkstore_sa.QueueService.send` (all optional).

    Each one overrides the queue's value for this job only.
    """

    start_after: dt.datetime | dt.timedelta | int | float | str


class JobSpec(SendOptions, total=False):
    """One job of :meth:`~alkstore_sa.QueueService.send_many`: its data plus options."""

    data: Any


QUEUE_OPTION_NAMES = frozenset(QueueOptions.__annotations__)
SEND_OPTION_NAMES = frozenset(SendOptions.__annotations__)
UPDATABLE_QUEUE_OPTIONS = QUEUE_OPTION_NAMES - {"policy", "partition"}


def check_int(option: str, value: object, *, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionsError(option, f"must be an integer, not {value!r}")
    if value < minimum or value > maximum:
        raise InvalidOptionsError(option, f"must be between {minimum} and {maximum}, not {value}")
    return value


def check_bool(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionsError(option, f"must be True or False, not {value!r}")
    return value


def check_text(
    option: str, value: object, *, allow_empty: bool = True, max_bytes: int | None = None
) -> str:
    """A string PostgreSQL can store in a ``text`` column: no NUL character, valid
    UTF-8 and, with ``max_bytes``, at most that many bytes once encoded (the limit of
    a value that enters an index, see :mod:`alkstore_sa.limits`)."""
    if not isinstance(value, str):
        raise InvalidOptionsError(option, f"must be a string, not {value!r}")
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


_INT_RULES: dict[str, tuple[int, int]] = {
    "retry_limit": (0, INT32_MAX),
    "retry_delay": (0, INT32_MAX),
    "retry_delay_max": (0, INT32_MAX),
    "expire_seconds": (1, EXPIRE_MAX),
    "retention_seconds": (1, INT32_MAX),
    "deletion_seconds": (1, INT32_MAX),
    "warning_queued": (0, INT32_MAX),
    "singleton_seconds": (1, INT32_MAX),
    "singleton_offset": (-INT32_MAX - 1, INT32_MAX),
    "priority": (-INT32_MAX - 1, INT32_MAX),
}


def _check_common(opts: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if value is None and key in ("retry_delay_max", "dead_letter", "singleton_key"):
            out[key] = None
        elif key in _INT_RULES:
            lo, hi = _INT_RULES[key]
            out[key] = check_int(key, value, minimum=lo, maximum=hi)
        elif key in ("retry_backoff", "partition"):
            out[key] = check_bool(key, value)
        elif key == "singleton_key":
            out[key] = check_text(key, value, max_bytes=limits.MAX_SINGLETON_KEY_BYTES)
        else:
            out[key] = value
    if out.get("retry_delay_max") is not None and out.get("retry_backoff") is False:
        raise InvalidOptionsError("retry_delay_max", "is only allowed with retry_backoff=True")
    return out


def queue_options(name: str, opts: Mapping[str, Any], *, update: bool = False) -> dict[str, Any]:
    """Validate queue options; returns a normalised copy."""
    check_unknown(
        opts,
        UPDATABLE_QUEUE_OPTIONS if update else QUEUE_OPTION_NAMES,
        "update_queue" if update else "queue",
    )
    out = _check_common(opts)
    if "policy" in out:
        try:
            out["policy"] = QueuePolicy(out["policy"]).value
        except ValueError:
            raise InvalidOptionsError(
                "policy",
                f"{out['policy']!r} is not one of " + ", ".join(p.value for p in QueuePolicy),
            ) from None
    if out.get("dead_letter") is not None:
        validate_queue(out["dead_letter"], "dead_letter")
        if out["dead_letter"] == name:
            raise InvalidOptionsError("dead_letter", "a queue cannot be its own dead letter queue")
    if out.get("retry_delay_max") is not None and not update and not out.get("retry_backoff"):
        raise InvalidOptionsError("retry_delay_max", "is only allowed with retry_backoff=True")
    return out


def pgboss_queue_json(name: str, opts: Mapping[str, Any]) -> dict[str, Any]:
    """The options object the ``create_queue`` SQL function reads (pg-boss's names)."""
    mapping = {
        "policy": "policy",
        "partition": "partition",
        "dead_letter": "deadLetter",
        "retry_limit": "retryLimit",
        "retry_delay": "retryDelay",
        "retry_backoff": "retryBackoff",
        "retry_delay_max": "retryDelayMax",
        "expire_seconds": "expireInSeconds",
        "retention_seconds": "retentionSeconds",
        "deletion_seconds": "deleteAfterSeconds",
        "warning_queued": "warningQueueSize",
    }
    out = {mapping[k]: v for k, v in opts.items() if v is not None}
    out.setdefault("policy", QueuePolicy.STANDARD.value)
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
        if value.tzinfo is None:
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
        return StartAfter(value, None)
    if isinstance(value, dt.timedelta):
        if value > _LONGEST_WAIT:
            raise InvalidOptionsError("start_after", f"must be at most {_LONGEST_WAIT.days} days")
        return StartAfter(None, value if value > dt.timedelta(0) else None)
    if isinstance(value, bool):
        raise InvalidOptionsError("start_after", f"unsupported value {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidOptionsError("start_after", f"must be finite, not {value!r}")
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
                "start_after", f"{value!r} is neither a number of seconds nor an ISO-8601 time"
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
    raise InvalidOptionsError("id", f"{value!r} is not a UUID")


def job_ids(ids: object) -> list[uuid.UUID]:
    """Accept one id or an iterable of ids."""
    if isinstance(ids, uuid.UUID | str):
        return [job_id(ids)]
    if isinstance(ids, list | tuple | set | frozenset):
        return [job_id(i) for i in ids]
    raise InvalidOptionsError("ids", f"expected a UUID or a list of UUIDs, not {ids!r}")


SEND_TO_PGBOSS = {
    "id": "id",
    "priority": "priority",
    "start_after": "startAfter",
    "singleton_key": "singletonKey",
    "singleton_seconds": "singletonSeconds",
    "expire_seconds": "expireInSeconds",
    "retention_seconds": "retentionSeconds",
    "deletion_seconds": "deleteAfterSeconds",
    "retry_limit": "retryLimit",
    "retry_delay": "retryDelay",
    "retry_backoff": "retryBackoff",
    "retry_delay_max": "retryDelayMax",
    "dead_letter": "deadLetter",
}
"""Our send option names and pg-boss's, for options stored where Node reads them."""

PGBOSS_TO_SEND = {v: k for k, v in SEND_TO_PGBOSS.items()}


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
        if key == "start_after":
            value = pgboss_start_after(value)
            if value is None:
                continue
        elif key == "id":
            value = str(value)
        out[SEND_TO_PGBOSS[key]] = value
    return out


def from_pgboss_send_options(opts: Mapping[str, Any] | None) -> dict[str, Any]:
    """Send options stored by Node pg-boss or by us, in our names (unknown keys dropped)."""
    out: dict[str, Any] = {}
    for key, value in (opts or {}).items():
        if key in PGBOSS_TO_SEND and value is not None:
            out[PGBOSS_TO_SEND[key]] = value
    return out
