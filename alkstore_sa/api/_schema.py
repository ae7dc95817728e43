"""JSON Schema for the HTTP API, derived from what the service already declares.

The operations are :class:`~alkstore_sa.QueueService` methods; their parameters' type
hints give the request schemas, their return hints the response schemas (the records
become named components), and a queue or send option's schema comes from its row of the
option table (:data:`alkstore_sa.options.OPTIONS`: kind, bounds, size, nullability, help),
the same row the service validates it with. Nothing here is written by hand per endpoint,
so the document cannot drift from what the service accepts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import options as opt
from ..groups import GroupConcurrencyConfig
from ..models.enums import QueuePolicy
from ..records import Job, Settlement

Schema = dict[str, Any]

REF = "#/components/schemas/"


def option_schema(spec: opt.OptionSpec) -> Schema:
    """The JSON Schema of one option's value, from its row of the option table."""
    kind = spec.kind
    schema: Schema
    if kind == "int":
        schema = {"type": "integer", "minimum": spec.minimum, "maximum": spec.maximum}
    elif kind == "bool":
        schema = {"type": "boolean"}
    elif kind in ("text", "queue"):
        schema = {"type": "string"}
        if spec.max_bytes is not None:
            # Bytes of UTF-8 in the table; JSON Schema counts characters, so this bound
            # is the loosest the byte limit allows and the service checks the bytes.
            schema["maxLength"] = spec.max_bytes
        if not spec.allow_empty:
            schema["minLength"] = 1
    elif kind == "policy":
        schema = {"type": "string", "enum": [p.value for p in QueuePolicy]}
    elif kind == "uuid":
        schema = {"type": "string", "format": "uuid"}
    elif kind == "when":
        schema = {
            "anyOf": [
                {"type": "number", "description": "seconds from now"},
                {"type": "string", "description": "an ISO-8601 time with its offset"},
            ]
        }
    else:  # a kind added to the table without a schema here
        raise LookupError(f"option kind {kind!r} has no JSON Schema")
    if spec.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if spec.help:
        schema["description"] = spec.help
    return schema


def _typed_dict_schema(cls: Any, components: dict[str, Schema]) -> Schema:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Schema] = {}
    for key, hint in hints.items():
        spec = opt.OPTION.get(key)
        properties[key] = option_schema(spec) if spec is not None else schema_of(hint, components)
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    required = sorted(getattr(cls, "__required_keys__", frozenset()))
    if required:
        schema["required"] = required
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split("\n\n")[0].split())
    return schema


def _record_schema(cls: Any, components: dict[str, Schema]) -> Schema:
    """A ``$ref`` to the record's component, made on first use."""
    name = cls.__name__
    if name not in components:
        components[name] = {}  # placeholder: records may refer to themselves
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        components[name] = {
            "type": "object",
            "properties": {f.name: schema_of(hints[f.name], components) for f in fields},
            "required": [f.name for f in fields],
            "description": " ".join((cls.__doc__ or name).split("\n\n")[0].split()),
        }
    return {"$ref": REF + name}


_INPUT_ONLY_SKIPPED = (Job, GroupConcurrencyConfig)
"""Types a Python caller may pass that a JSON client cannot (a fetched :class:`Job`
is sent by its id; a group concurrency config object by its number)."""


def schema_of(hint: Any, components: dict[str, Schema], *, request: bool = False) -> Schema:
    """The JSON Schema of a value of type ``hint``; records become components.

    ``request``: the schema of an argument a JSON client sends (a :class:`Job` is
    given by its id, so that member of a union is left out)."""
    if hint is Any or hint is object:
        return {}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if hint is uuid.UUID:
        return {"type": "string", "format": "uuid"}
    if hint is dt.datetime:
        return {"type": "string", "format": "date-time"}
    if hint is dt.timedelta:
        return {"type": "number", "description": "seconds"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [m.value for m in hint]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if not (request and a in _INPUT_ONLY_SKIPPED)]
        if request:
            # A sequence of Job | UUID | str is a sequence of ids for a JSON client.
            members = [_without_records(a) for a in members]
        schemas: list[Schema] = []
        for member in members:
            s = schema_of(member, components, request=request)
            if s not in schemas:
                schemas.append(s)
        # UUID | str: a string, which the service reads as an id.
        if {"type": "string", "format": "uuid"} in schemas and {"type": "string"} in schemas:
            schemas.remove({"type": "string"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if origin in (list, tuple, Sequence, Iterable, set, frozenset) or (
        isinstance(origin, type) and issubclass(origin, Sequence | Iterable) and origin is not str
    ):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {
                "type": "array",
                "prefixItems": [schema_of(a, components, request=request) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        item = args[0] if args else Any
        return {"type": "array", "items": schema_of(item, components, request=request)}
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": schema_of(value, components)}
    if typing.is_typeddict(hint):
        return _typed_dict_schema(hint, components)
    if request and hint is Settlement:
        return _settlement_schema()
    if dataclasses.is_dataclass(hint):
        return _record_schema(hint, components)
    if origin is typing.Literal:
        return {"enum": list(args)}
    raise LookupError(f"no JSON Schema for {hint!r}")


def _settlement_schema() -> Schema:
    """A settlement as a JSON client sends it: the job's id, the output, and the fetched
    job's ``started_on`` to fence on."""
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "output": {},
            "started_on": {
                "anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}],
                "description": "the fetched job's started_on: the settlement is fenced on it",
            },
        },
        "required": ["id"],
        "additionalProperties": False,
    }


def _without_records(hint: Any) -> Any:
    """``hint`` with :class:`Job` left out of the unions inside a sequence."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (list, Sequence) and args:
        inner = args[0]
        if typing.get_origin(inner) in (typing.Union, types.UnionType):
            kept = tuple(a for a in typing.get_args(inner) if a not in _INPUT_ONLY_SKIPPED)
            return Sequence[typing.Union[kept]]  # type: ignore[valid-type]  # noqa: UP007
    return hint
