"""The one-line integration (``eventguard.foundry``) under uvicorn, called by the ``openai`` client."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import openai
import pytest

from eventguard import Guard, Lifecycle
from eventguard.testing import ScriptedChatClient, chat_agent, loopback_server, workflow_agent

from ._drivers import STEP, wait_for, wait_until

pytestmark = [pytest.mark.upstream]


class ListSink:
    """The smallest sink: keeps every lifecycle it was given and counts forwarded events."""

    def __init__(self) -> None:
        self.lifecycles: list[Lifecycle] = []
        self.events: dict[int, int] = {}
        self.closed: list[Lifecycle] = []

    def recorder(self, lifecycle: Lifecycle) -> Any:
        sink = self
        self.lifecycles.append(lifecycle)

        class _Recorder:
            def event(self, index: int, event_type: str | None, event: object) -> None:
                sink.events[id(lifecycle)] = index + 1

            def changed(self) -> None:
                pass

            async def close(self) -> None:
                sink.closed.append(lifecycle)

        return _Recorder()

    def by_id(self, response_id: str) -> Lifecycle:
        return next(lc for lc in reversed(self.lifecycles) if lc.info.response_id == response_id)


def serving(app: Any) -> AbstractAsyncContextManager[str]:
    return loopback_server(app, within=STEP, log_level="warning")


def openai_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", timeout=STEP, max_retries=0)


def make(agent: Any, sink: ListSink, **options: Any) -> Any:
    from eventguard.foundry import GuardedResponsesHostServer

    return GuardedResponsesHostServer(agent, sink=sink, configure_observability=None, **options)


async def ended(server: Any, response_id: str) -> Lifecycle:
    guard: Guard | None = None

    def done() -> bool:
        nonlocal guard
        guard = server.guard_for(response_id)
        return guard is not None and guard.lifecycle.ended

    await wait_until(done, STEP)
    assert guard is not None
    return guard.lifecycle


async def test_openai_stream_completes_and_records_what_the_host_knows() -> None:
    agent, _ = chat_agent(ScriptedChatClient(("Hi", " there")), name="loopback-chat")
    sink = ListSink()
    server = make(agent, sink)
    async with serving(server) as base_url, openai_client(base_url) as client:
        async with asyncio.timeout(STEP):
            stream = await client.responses.create(model="scripted", input="go", stream=True)
            types = [event.type async for event in stream]
        response_id = sink.lifecycles[-1].info.response_id
        assert response_id is not None
        async with asyncio.timeout(STEP):
            retrieved = await client.responses.retrieve(response_id)
        lifecycle = await ended(server, response_id)
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    assert retrieved.status == "completed"
    assert lifecycle.state == retrieved.status
    assert lifecycle is sink.by_id(response_id)
    assert lifecycle in sink.closed
    info = lifecycle.info
    assert info.agent_name == "loopback-chat"
    assert (info.background, info.stream, info.store) == (False, True, True)
    assert info.chain_id  # context.conversation_chain_id
    assert not info.is_recovery
    assert not info.is_steered_turn


async def test_openai_background_cancel_of_suspended_workflow() -> None:
    """The seed, end to end: POST, cancel and retrieve through the official client."""
    agent, probe = workflow_agent("stuck", name="loopback-seed")
    sink = ListSink()
    server = make(agent, sink)
    async with serving(server) as base_url, openai_client(base_url) as client:
        async with asyncio.timeout(STEP):
            created = await client.responses.create(model="scripted", input="go", background=True, store=True)
        await wait_for(probe.started)
        async with asyncio.timeout(STEP):
            cancelled = await client.responses.cancel(created.id)
        await wait_for(probe.interrupted)
        lifecycle = await ended(server, created.id)
        async with asyncio.timeout(STEP):
            retrieved = await client.responses.retrieve(created.id)
    assert cancelled.status == "cancelled"
    assert retrieved.status == "cancelled"
    assert lifecycle.state == retrieved.status
    assert lifecycle.info.background is True


async def test_openai_client_disconnect_mid_stream() -> None:
    """A real socket close (uvicorn sends ``http.disconnect``) while text is streaming."""
    agent, probe = chat_agent(ScriptedChatClient(hang_after=2))
    sink = ListSink()
    server = make(agent, sink)
    async with serving(server) as base_url, openai_client(base_url) as client:
        async with asyncio.timeout(STEP):
            stream = await client.responses.create(model="scripted", input="go", stream=True, store=True)
            async for event in stream:
                if event.type == "response.output_text.delta":
                    break
            await stream.close()
        await wait_for(probe.interrupted)
        response_id = sink.lifecycles[-1].info.response_id
        assert response_id is not None
        lifecycle = await ended(server, response_id)
        async with asyncio.timeout(STEP):
            while (retrieved := await client.responses.retrieve(response_id)).status == "in_progress":  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    assert retrieved.status == "cancelled"
    assert lifecycle.state == retrieved.status


async def test_mixin_options_as_class_attributes_and_on_guard_hook() -> None:
    from agent_framework_foundry_hosting import ResponsesHostServer

    from eventguard.foundry import GuardedResponses, guarded_server

    seen: list[Guard] = []

    class Quiet(GuardedResponses, ResponsesHostServer):  # type: ignore[misc]
        eventguard_on_cancel = "emit"
        eventguard_cancel_grace = 1.5
        eventguard_keep_guards = 1

    agent, _ = chat_agent()
    server = Quiet(agent, on_guard=seen.append, configure_observability=None)
    assert server._eventguard_on_cancel == "emit"
    assert server._eventguard_cancel_grace == 1.5
    async with serving(server) as base_url, openai_client(base_url) as client:
        async with asyncio.timeout(STEP):
            first = await client.responses.create(model="scripted", input="one")
            second = await client.responses.create(model="scripted", input="two")
    assert [g.lifecycle.info.response_id for g in seen] == [first.id, second.id]
    assert server.guard_for(first.id) is None  # only the last guard is kept
    assert server.guard_for(second.id) is seen[1]
    assert guarded_server(ResponsesHostServer).__mro__[1] is GuardedResponses
    assert guarded_server(Quiet) is Quiet


async def test_an_on_guard_hook_that_raises_is_logged_and_the_response_goes_on(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the hook's error left the guard unstepped: the host recorded the response failed and
    the database kept its row 'new' for good."""
    from eventguard.foundry import GuardedResponsesHostServer
    from eventguard.sink import SqlSink
    from eventguard.store import ResponseStore

    def broken(_g: Guard) -> None:
        raise KeyError("the metrics registry is gone")

    url = f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}"
    agent, _ = chat_agent()
    async with SqlSink(url, spool_path=tmp_path / "spool.jsonl") as sink:
        server = GuardedResponsesHostServer(agent, sink=sink, on_guard=broken, configure_observability=None)
        async with serving(server) as base_url, openai_client(base_url) as client:
            async with asyncio.timeout(STEP):
                done = await client.responses.create(model="scripted", input="one")
                streamed = [
                    ev.type async for ev in await client.responses.create(model="s", input="two", stream=True)
                ]
    assert done.status == "completed" and streamed[-1] == "response.completed"
    assert (
        caplog.text.count("on_guard raised for response") == 2
        and "the metrics registry is gone" in caplog.text
    )
    async with ResponseStore(url) as store, asyncio.timeout(STEP):
        rows = await store.recent(limit=10)
    assert sorted(r.status for r in rows) == ["completed", "completed"]
