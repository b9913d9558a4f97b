"""eventguard's test kit: what its own tests and ``eventguard demo`` use, public for yours.

- Scripted streams (:mod:`eventguard.testing.streams`, no host needed): :func:`event`, :func:`terminal`,
  :func:`stream_events`, :class:`Scripted` (faults before chosen events, counts its closes),
  :func:`block_ignoring_signal` (a ``before`` hook for a stuck stream) and :func:`host_context` (the
  response context the guard reads).
- Scripted hosts (:mod:`eventguard.testing.host`, model-free parts for a real ``ResponsesHostServer``):
  :func:`workflow_agent` (an executor that completes, raises, streams or suspends),
  :class:`ScriptedChatClient` and :func:`chat_agent`, :class:`Probe` (what happened inside, to wait
  on), :func:`trigger_shutdown`.
- The tap (:mod:`eventguard.testing.taps`): :func:`tap` yields a stream unchanged and records each event
  as a :class:`Seen`, with the host's cause flags at that moment.
- A loopback server (:mod:`eventguard.testing.server`): :func:`loopback_server` serves an ASGI app
  under uvicorn on ``127.0.0.1`` for as long as a block lasts; :func:`wait_until` polls, bounded.

Names are loaded on first use: the host parts import the agent framework, the server uvicorn. Nothing
in :mod:`eventguard` itself imports this package.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventguard.testing.host import (
        Probe,
        ScenarioExecutor,
        ScriptedChatClient,
        WorkflowBehaviour,
        chat_agent,
        text_update,
        trigger_shutdown,
        workflow_agent,
    )
    from eventguard.testing.server import loopback_server, wait_until
    from eventguard.testing.streams import (
        Scripted,
        block_ignoring_signal,
        event,
        host_context,
        stream_events,
        terminal,
    )
    from eventguard.testing.taps import TERMINAL_TYPES, Seen, seen, tap

_WHERE = {
    "Probe": "host",
    "ScenarioExecutor": "host",
    "ScriptedChatClient": "host",
    "WorkflowBehaviour": "host",
    "chat_agent": "host",
    "text_update": "host",
    "trigger_shutdown": "host",
    "workflow_agent": "host",
    "loopback_server": "server",
    "wait_until": "server",
    "Scripted": "streams",
    "block_ignoring_signal": "streams",
    "event": "streams",
    "host_context": "streams",
    "stream_events": "streams",
    "terminal": "streams",
    "TERMINAL_TYPES": "taps",
    "Seen": "taps",
    "seen": "taps",
    "tap": "taps",
}

__all__ = [
    "TERMINAL_TYPES",
    "Probe",
    "ScenarioExecutor",
    "Scripted",
    "ScriptedChatClient",
    "Seen",
    "WorkflowBehaviour",
    "block_ignoring_signal",
    "chat_agent",
    "event",
    "host_context",
    "loopback_server",
    "seen",
    "stream_events",
    "tap",
    "terminal",
    "text_update",
    "trigger_shutdown",
    "wait_until",
    "workflow_agent",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"eventguard.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
