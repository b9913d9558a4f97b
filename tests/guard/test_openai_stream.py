"""The guard over an ``openai`` SDK stream: typed events (objects with ``.type``), not dicts.

The stream comes from the real ResponsesHostServer, called in-process by the official client.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import httpx
import openai
import pytest

from eventguard import Cause, State, guard
from eventguard.testing import workflow_agent

pytestmark = pytest.mark.upstream


def client_for(server: Any) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://host")
    return openai.AsyncOpenAI(base_url="http://host", api_key="unused", http_client=http, max_retries=0)


def host(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from agent_framework_foundry_hosting import ResponsesHostServer

    monkeypatch.setenv("AGENTSERVER_STATE_ROOT", str(tmp_path))
    agent, _ = workflow_agent("complete", text=("Hello", " from", " the host"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ResponsesHostServer(agent, configure_observability=None)


async def test_typed_sdk_events_pass_through_and_the_lifecycle_completes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_for(host(tmp_path, monkeypatch))
    async with asyncio.timeout(20):
        stream = await client.responses.create(model="any", input="hi", stream=True)
        g = guard(stream, asyncio.Event())
        async with g:
            out = [e async for e in g]
    types = [e.type for e in out]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    assert not isinstance(out[0], dict)  # the SDK's own objects, untouched
    assert g.lifecycle.state is State.COMPLETED
    assert g.lifecycle.cause is Cause.NORMAL
    assert g.lifecycle.info.response_id == out[0].response.id
    assert g.lifecycle.anomalies == []
    assert g.lifecycle.events_forwarded == len(out)


async def test_a_set_signal_withholds_the_sdk_completed_event(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_for(host(tmp_path, monkeypatch))
    signal = asyncio.Event()
    async with asyncio.timeout(20):
        stream = await client.responses.create(model="any", input="hi", stream=True)
        g = guard(stream, signal)
        async with g:
            out = []
            async for e in g:
                out.append(e)
                if e.type == "response.output_text.delta":
                    signal.set()  # the caller gave up: no context, so a client cancel
    assert "response.completed" not in [e.type for e in out]
    assert g.lifecycle.state is State.CANCELLED
    assert [a.kind for a in g.lifecycle.anomalies] == ["terminal_withheld"]


async def test_closing_the_guard_closes_the_sdk_stream(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_for(host(tmp_path, monkeypatch))
    async with asyncio.timeout(20):
        stream = await client.responses.create(model="any", input="hi", stream=True)
        async with guard(stream, asyncio.Event()) as g:
            async for _ in g:
                break
    assert stream.response.is_closed
