"""The OpenAPI 3.1 document of the HTTP API, and its documentation page, both made from
the operation table (:mod:`._operations`) and so from the service's own declarations."""

from __future__ import annotations

import html
import json
from typing import Any

from .._version import __version__
from ._operations import OPERATIONS, Operation, request_schema, response_schema
from ._schema import REF, Schema, schema_of

PROBLEM: Schema = {
    "type": "object",
    "description": (
        "An error, as RFC 9457 problem details (application/problem+json): title is the "
        "library's error name (InvalidOptionsError, QueueNotFoundError...), detail its "
        "message. ok and error repeat them in the success envelope's shape."
    ),
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "ok": {"const": False},
        "error": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "message": {"type": "string"},
                "option": {"type": ["string", "null"]},
            },
            "required": ["name", "message"],
        },
    },
    "required": ["type", "title", "status", "detail", "ok", "error"],
}


def _is_array(schema: Schema) -> bool:
    if schema.get("type") == "array":
        return True
    return any(_is_array(s) for s in schema.get("anyOf", []))


def _operation_entry(op: Operation, components: dict[str, Schema]) -> dict[str, Any]:
    result = response_schema(op, components)
    entry: dict[str, Any] = {
        "operationId": op.name,
        "tags": [op.tag],
        "summary": op.summary,
        "description": op.description
        + f"\n\nAlso at `/api/{op.camel}` (pg-boss's name)." * (op.camel != op.name),
        "responses": {
            "200": {
                "description": "the service's answer, as `result`",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {"ok": {"const": True}, "result": result},
                            "required": ["ok", "result"],
                        }
                    }
                },
            },
            "default": {"$ref": "#/components/responses/Problem"},
        },
    }
    if op.reads:
        parameters = []
        for p in op.params:
            schema = schema_of(p.hint, components, request=True)
            param: dict[str, Any] = {
                "name": p.name,
                "in": "query",
                "required": p.required,
                "schema": schema,
            }
            if _is_array(schema):
                param.update(style="form", explode=True)
            parameters.append(param)
        entry["parameters"] = parameters
    else:
        entry["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": request_schema(op, components)}},
        }
    return entry


def openapi_document(title: str = "alkstore API") -> dict[str, Any]:
    """The OpenAPI 3.1 document of every operation."""
    components: dict[str, Schema] = {}
    paths = {op.path: {op.method: _operation_entry(op, components)} for op in OPERATIONS}
    components["Problem"] = PROBLEM
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": __version__,
            "description": (
                "The queue operations of alkstore_sa's QueueService over JSON: each request "
                "is one transaction. Reads are GET with their arguments in the query "
                "string, the rest POST with a JSON object. A success is "
                '{"ok": true, "result": ...}; an error is application/problem+json.'
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                "Problem": {
                    "description": "bad input, an unknown queue, a refused token, a timeout",
                    "content": {"application/problem+json": {"schema": {"$ref": REF + "Problem"}}},
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        # A token when the API asks for one (off loopback); none on loopback.
        "security": [{"bearer": []}, {}],
        "tags": [{"name": t} for t in dict.fromkeys(op.tag for op in OPERATIONS)],
    }


def _type_text(schema: Schema) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_type_text(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return f"array of {_type_text(items)}" if isinstance(items, dict) else "array"
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if kind is None:
        return "any JSON"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


def docs_page(document: dict[str, Any]) -> str:
    """A plain HTML page describing every operation (no script, nothing loaded from
    elsewhere), from the OpenAPI document."""
    esc = html.escape
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{esc(document['info']['title'])}</title>",
        "<style>body{font:14px/1.45 system-ui,sans-serif;max-width:60em;margin:1em auto;"
        "padding:0 1em}code{background:#f2f3f5;padding:0 .2em}section{border-top:1px solid "
        "#dde1e7;padding:.5em 0}table{border-collapse:collapse}td,th{border:1px solid "
        "#dde1e7;padding:.2em .5em;text-align:left;vertical-align:top}</style></head><body>",
        f"<h1>{esc(document['info']['title'])} <small>{esc(document['info']['version'])}"
        "</small></h1>",
        f"<p>{esc(document['info']['description'])}</p>",
        '<p>The machine-readable description: <a href="openapi.json">openapi.json</a>.</p>',
    ]
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            parts.append(f'<section id="{esc(op["operationId"])}">')
            parts.append(f"<h2><code>{method.upper()} {esc(path)}</code></h2>")
            parts.append(f"<p>{esc(op['summary'])}</p>")
            rows: list[tuple[str, Schema, bool]] = []
            if "parameters" in op:
                rows = [(p["name"], p["schema"], p["required"]) for p in op["parameters"]]
            else:
                body = op["requestBody"]["content"]["application/json"]["schema"]
                needed = set(body.get("required", []))
                rows = [(k, v, k in needed) for k, v in body["properties"].items()]
            if rows:
                where = "query" if "parameters" in op else "JSON body"
                parts.append(f"<table><tr><th>{where}</th><th>type</th><th></th></tr>")
                for name, schema, must in rows:
                    parts.append(
                        f"<tr><td><code>{esc(name)}</code></td><td>{esc(_type_text(schema))}"
                        f"</td><td>{'required' if must else ''}</td></tr>"
                    )
                parts.append("</table>")
            result = op["responses"]["200"]["content"]["application/json"]["schema"]
            parts.append(
                f"<p>result: {esc(_type_text(result['properties']['result']))}</p></section>"
            )
    parts.append("</body></html>")
    return "".join(parts)
