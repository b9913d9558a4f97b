"""Scripted hosts: model-free building blocks that drive a real ``ResponsesHostServer``.

Used by eventguard's tests and by ``eventguard demo``. Nothing here talks to a model or the network:

- workflow executors that complete, raise, stream text, or suspend until cancelled;
- :class:`ScriptedChatClient`, a chat client that streams a fixed script of text chunks;
- :func:`trigger_shutdown`, which signals graceful shutdown the way each path of the host does.

Every executor/client reports what happened to it through a :class:`Probe`, so a driver can wait for
"the run is now suspended" instead of sleeping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_framework import (
    Agent,
    AgentResponseUpdate,
    BaseChatClient,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    Executor,
    Message,
    ResponseStream,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)

__all__ = [
    "Probe",
    "ScenarioExecutor",
    "ScriptedChatClient",
    "WorkflowBehaviour",
    "chat_agent",
    "text_update",
    "trigger_shutdown",
    "workflow_agent",
]

LONG_SLEEP = 3600.0  # stands in for a slow model or tool call


@dataclass
class Probe:
    """What happened inside a scenario's executor or chat client, observable without sleeping."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0


def text_update(text: str, *, message_id: str, finish_reason: str | None = None) -> AgentResponseUpdate:
    """One assistant text chunk, as a workflow executor yields it."""
    return AgentResponseUpdate(
        contents=[Content.from_text(text)],
        role="assistant",
        message_id=message_id,
        finish_reason=finish_reason,  # type: ignore[arg-type]
    )


WorkflowBehaviour = Literal["complete", "stuck", "text_then_stuck", "raise", "text_then_raise"]


class ScenarioExecutor(Executor):
    """A single-executor workflow whose behaviour is chosen by name.

    - ``complete``: yields ``text`` and returns.
    - ``stuck``: suspends (the seed scenario) until cancelled.
    - ``text_then_stuck``: yields ``text`` as output, then suspends until cancelled.
    - ``raise``: raises ``RuntimeError(error_message)`` at once.
    - ``text_then_raise``: yields ``text``, then raises.
    """

    def __init__(
        self,
        behaviour: WorkflowBehaviour,
        probe: Probe,
        *,
        text: Sequence[str] = ("Hello", " world"),
        error_message: str = "executor exploded",
        executor_id: str = "scenario",
    ) -> None:
        super().__init__(id=executor_id)
        self._behaviour = behaviour
        self._probe = probe
        self._text = tuple(text)
        self._error_message = error_message

    @handler
    async def run(self, messages: list[Message], ctx: WorkflowContext[Any, Any]) -> None:
        probe = self._probe
        probe.calls += 1
        probe.started.set()
        message_id = f"msg_{uuid.uuid4().hex}"
        try:
            if self._behaviour in ("complete", "text_then_stuck", "text_then_raise"):
                for chunk in self._text:
                    await ctx.yield_output(text_update(chunk, message_id=message_id))
                probe.streamed.set()
            if self._behaviour in ("raise", "text_then_raise"):
                raise RuntimeError(self._error_message)
            if self._behaviour in ("stuck", "text_then_stuck"):
                await asyncio.sleep(LONG_SLEEP)
        except asyncio.CancelledError:
            probe.interrupted.set()
            raise
        probe.finished.set()


def workflow_agent(
    behaviour: WorkflowBehaviour,
    probe: Probe | None = None,
    *,
    name: str = "scenario-workflow",
    text: Sequence[str] = ("Hello", " world"),
    error_message: str = "executor exploded",
) -> tuple[Any, Probe]:
    """A ``WorkflowAgent`` (``WorkflowBuilder(...).build().as_agent()``) of one :class:`ScenarioExecutor`."""
    probe = probe or Probe()
    executor = ScenarioExecutor(behaviour, probe, text=text, error_message=error_message)
    agent = WorkflowBuilder(start_executor=executor).build().as_agent(name=name)
    return agent, probe


class ScriptedChatClient(BaseChatClient):
    """A chat client that streams a fixed script, no model.

    ``chunks`` are streamed as assistant text, ``delay`` seconds apart. With ``hang_after`` set, the
    stream suspends (until cancelled) after that many chunks, as a slow model would. ``finish_reason``
    goes on the last update (``"length"`` or ``"content_filter"`` to simulate a model stop).
    """

    OTEL_PROVIDER_NAME = "eventguard-scripted"
    STORES_BY_DEFAULT = False

    def __init__(
        self,
        chunks: Sequence[str] = ("Hello", " from", " the", " script"),
        *,
        delay: float = 0.0,
        hang_after: int | None = None,
        finish_reason: str | None = "stop",
        probe: Probe | None = None,
    ) -> None:
        super().__init__()
        self._chunks = tuple(chunks)
        self._delay = delay
        self._hang_after = hang_after
        self._finish_reason = finish_reason
        self.probe = probe or Probe()

    def _inner_get_response(
        self,
        *,
        messages: Sequence[Message],
        stream: bool,
        options: Mapping[str, Any],
        **kwargs: Any,
    ) -> Awaitable[ChatResponse] | ResponseStream[ChatResponseUpdate, ChatResponse]:
        if stream:
            return self._build_response_stream(self._stream())
        return self._whole()

    async def _stream(self) -> AsyncIterator[ChatResponseUpdate]:
        probe = self.probe
        probe.calls += 1
        probe.started.set()
        message_id = f"msg_{uuid.uuid4().hex}"
        try:
            for index, chunk in enumerate(self._chunks):
                if self._hang_after is not None and index == self._hang_after:
                    probe.streamed.set()
                    await asyncio.sleep(LONG_SLEEP)
                last = index == len(self._chunks) - 1
                yield ChatResponseUpdate(
                    role="assistant",
                    contents=[Content.from_text(chunk)],
                    message_id=message_id,
                    finish_reason=self._finish_reason if last else None,  # type: ignore[arg-type]
                )
                if self._delay:
                    await asyncio.sleep(self._delay)
            probe.streamed.set()
            if self._hang_after is not None and self._hang_after >= len(self._chunks):
                await asyncio.sleep(LONG_SLEEP)
        except asyncio.CancelledError:
            probe.interrupted.set()
            raise
        probe.finished.set()

    async def _whole(self) -> ChatResponse:
        updates = [update async for update in self._stream()]
        return ChatResponse.from_updates(updates)


def chat_agent(client: ScriptedChatClient | None = None, *, name: str = "scenario-chat") -> tuple[Any, Probe]:
    """A chat ``Agent`` over a :class:`ScriptedChatClient`."""
    client = client or ScriptedChatClient()
    return Agent(client=client, name=name), client.probe


ShutdownPath = Literal["request", "endpoint"]


async def trigger_shutdown(server: Any, path: ShutdownPath = "request") -> None:
    """Signal graceful shutdown to a running ``ResponsesHostServer`` (any release).

    - ``"request"``: ``server.request_shutdown()``, what the host's SIGTERM pre-shutdown callback does.
      Foreground responses see it through their disconnect monitor, which sets ``context.shutdown``
      *and* the cancellation signal. Background responses are not told.
    - ``"endpoint"``: the responses layer's own ``handle_shutdown()`` (``server._endpoint``). It sets
      ``context.shutdown`` on every in-flight response (not the signal), waits the shutdown grace period
      for background runs, then marks the non-resilient ones failed. ``ResponsesHostServer`` replaces
      this handler with its own in the lifespan, so a real SIGTERM never reaches it; calling it is
      the only way to tell a background run about shutdown.
    """
    if path == "request":
        server.request_shutdown()
        return
    await server._endpoint.handle_shutdown()
