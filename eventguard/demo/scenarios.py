"""The demo's five scenarios: an agent each (model-free, from :mod:`eventguard.testing`) and how the
``openai`` client drives it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import openai

from eventguard.testing.host import ScriptedChatClient, chat_agent, trigger_shutdown, workflow_agent
from eventguard.testing.server import wait_until

__all__ = ["SCENARIO_TITLES", "STEP", "Ctx", "Scenario", "scenarios"]

#: Bound of one step (a request, a wait for an executor, the guard's ending).
STEP = 20.0


async def _wait_event(event: asyncio.Event, what: str) -> None:
    await wait_until(event.is_set, what, STEP)


@dataclass
class Ctx:
    """What one scenario needs: its server (for the tap and the guard) and a client."""

    server: Any
    client: openai.AsyncOpenAI

    def ended(self, response_id: str) -> bool:
        g = self.server.guard_for(response_id)
        return g is not None and g.lifecycle.ended


async def _completes(ctx: Ctx, probe: Any) -> str:
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(model="scripted", input="hello", stream=True, store=True)
        response_id = ""
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
    return response_id


async def _cancel_suspended(ctx: Ctx, probe: Any) -> str:
    """The seed: a background run cancelled through POST /cancel while its executor is suspended."""
    async with asyncio.timeout(STEP):
        created = await ctx.client.responses.create(
            model="scripted", input="work slowly", background=True, store=True
        )
    await _wait_event(probe.started, "the executor to start")
    async with asyncio.timeout(STEP):
        await ctx.client.responses.cancel(created.id)
    await _wait_event(probe.interrupted, "the executor to be interrupted")
    return created.id


async def _cancel_after_text(ctx: Ctx, probe: Any) -> str:
    """A background stream cancelled through POST /cancel once its text has reached the client."""
    response_id = ""
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(
            model="scripted", input="write, then wait", background=True, stream=True, store=True
        )
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_text.delta" and probe.streamed.is_set():
                break
        await ctx.client.responses.cancel(response_id)
        async for _event in stream:
            pass
    await _wait_event(probe.interrupted, "the executor to be interrupted")
    return response_id


async def _raises(ctx: Ctx, probe: Any) -> str:
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(model="scripted", input="explode", stream=True, store=True)
        response_id = ""
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
    return response_id


async def _shutdown(ctx: Ctx, probe: Any) -> str:
    """A streaming chat run cut short by graceful shutdown (the host's SIGTERM path)."""
    response_id = ""
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(
            model="scripted", input="tell me a long story", stream=True, store=True
        )
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_text.delta" and probe.streamed.is_set():
                break
        await trigger_shutdown(ctx.server, "request")
        async for _event in stream:
            pass
    return response_id


@dataclass(frozen=True)
class Scenario:
    title: str
    make_agent: Callable[[], tuple[Any, Any]]
    drive: Callable[[Ctx, Any], Awaitable[str]]


#: The scenarios' titles, in order.
SCENARIO_TITLES = (
    "completes",
    "cancel while suspended (seed)",
    "cancel after text streamed",
    "executor raises",
    "chat cut short by shutdown",
)


def scenarios() -> list[Scenario]:
    """The five scenarios, in order: each ``make_agent()`` builds a new agent and its probe."""
    story = ("Once", " upon", " a", " time", " there", " was", " a", " long", " story")
    return [
        Scenario(
            SCENARIO_TITLES[0],
            lambda: workflow_agent("complete", name="demo-completes", text=("Hello", ", world")),
            _completes,
        ),
        Scenario(
            SCENARIO_TITLES[1],
            lambda: workflow_agent("stuck", name="demo-seed"),
            _cancel_suspended,
        ),
        Scenario(
            SCENARIO_TITLES[2],
            lambda: workflow_agent("text_then_stuck", name="demo-cancel-text", text=("Partial", " answer")),
            _cancel_after_text,
        ),
        Scenario(
            SCENARIO_TITLES[3],
            lambda: workflow_agent("raise", name="demo-raises", error_message="tool call failed"),
            _raises,
        ),
        Scenario(
            SCENARIO_TITLES[4],
            lambda: chat_agent(ScriptedChatClient(story, hang_after=3), name="demo-chat"),
            _shutdown,
        ),
    ]
