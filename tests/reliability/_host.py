"""A real ``ResponsesHostServer`` with the one-line guard, a fault injector below it and a tap above it.

MRO: ``Tap -> GuardedResponses -> Injector -> ResponsesHostServer``. The injector wraps the host's own
handler (the stream the guard owns) and runs a fault just before inner event ``fault_at``; the tap
(``eventguard.testing.tap``) records what the guard forwarded to the host, and the mixin when the
guarded handler finished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from agent_framework_foundry_hosting import ResponsesHostServer

from eventguard.foundry import GuardedResponses
from eventguard.testing import Seen, tap

Fault = Callable[[Any, Any], Awaitable[None]]

CHUNKS = 22  # a scripted chat of 22 chunks is a 30-event response on both releases
EVENTS = 30


async def poll(predicate: Callable[[], bool], within: float, every: float = 0.01) -> bool:
    """Wait until ``predicate()`` holds or ``within`` seconds pass; say which (never raises)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)
    return True


class Injector:
    fault_at: int = -1
    fault: Fault | None = None

    async def _handle_response(self, request: Any, context: Any, signal: Any) -> AsyncIterator[Any]:
        upstream = super()._handle_response(request, context, signal)  # type: ignore[misc]
        fired = False
        i = 0
        try:
            async with aclosing(upstream):
                async for event in upstream:
                    if i == self.fault_at and self.fault is not None:
                        fired = True
                        await self.fault(context, signal)
                    i += 1
                    yield event
            if not fired and self.fault is not None and self.fault_at >= i:
                await self.fault(context, signal)
        finally:
            self.finalised += 1  # type: ignore[attr-defined]


class Tap:
    """Above the guard: :func:`eventguard.testing.tap` records what the guard forwarded to the host."""

    seen: list[Seen]

    @property
    def forwarded(self) -> list[Any]:
        return [s.event for s in self.seen]

    async def _handle_response(self, request: Any, context: Any, signal: Any) -> AsyncIterator[Any]:
        self.context = context
        self.response_id = context.response_id
        self.signal = signal
        guarded = super()._handle_response(request, context, signal)  # type: ignore[misc]
        try:
            async with aclosing(tap(guarded, self.seen, signal, context)) as events:
                async for event in events:
                    yield event
        except BaseException as exc:
            self.raised = exc
            raise
        finally:
            self.client_cancelled = bool(getattr(context, "client_cancelled", False))
            self.done.set()


class MatrixServer(Tap, GuardedResponses, Injector, ResponsesHostServer):  # type: ignore[misc]
    pass


def build(agent: Any, sink: Any, *, cancel_grace: float = 0.3, **kwargs: Any) -> MatrixServer:
    server = MatrixServer(agent, sink=sink, cancel_grace=cancel_grace, configure_observability=None, **kwargs)
    server.seen = []
    server.done = asyncio.Event()
    server.reached = asyncio.Event()
    server.proceed = asyncio.Event()
    server.finalised = 0
    server.raised = None
    server.context = None
    server.response_id = None
    server.client_cancelled = False
    return server


def event_type(event: object) -> str | None:
    if isinstance(event, dict):
        value = event.get("type")
        return value if isinstance(value, str) else None
    return None
