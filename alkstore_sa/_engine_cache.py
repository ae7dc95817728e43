"""Per-engine caches (queue policies, verified schemas) shared by every service and
supervisor on one engine, and the Context and execution options a service derives
from its schema."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from sqlalchemy import Engine

from .names import DEFAULT_SCHEMA, validate_schema
from .ops import Context, PolicyCache


class _EngineState:
    def __init__(self) -> None:
        self.policies = PolicyCache()
        self.checked: set[str] = set()


_states: weakref.WeakKeyDictionary[Engine, _EngineState] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def engine_state(engine: Engine) -> _EngineState:
    """Per-engine caches (queue policies, verified schemas), shared by all services."""
    state = _states.get(engine)
    if state is None:
        with _lock:
            state = _states.setdefault(engine, _EngineState())
    return state


def execution_options(schema: str) -> dict[str, Any]:
    """The execution options that point the models' ``pgboss`` schema at ``schema``."""
    return {"schema_translate_map": {DEFAULT_SCHEMA: schema}}


def make_context(
    schema: str, notify: bool, engine: Engine | None
) -> tuple[Context, _EngineState | None]:
    """The operations' Context for ``schema``, with the engine's caches when there is one."""
    validate_schema(schema)
    state = engine_state(engine) if engine is not None else None
    ctx = Context(
        schema=schema,
        notify=notify,
        policies=state.policies if state is not None else PolicyCache(),
    )
    return ctx, state
