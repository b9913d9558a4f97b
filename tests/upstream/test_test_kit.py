"""``eventguard.testing``: its public names, its tap and its loopback server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import httpx
import pytest

import eventguard.testing as kit
from eventguard.testing import Scripted, Seen, host_context, loopback_server, stream_events, tap, wait_until

pytestmark = [pytest.mark.upstream]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def test_every_public_name_resolves_and_import_eventguard_loads_none_of_the_kit() -> None:
    assert all(getattr(kit, name) is not None for name in kit.__all__)
    code = (
        "import sys, eventguard; "
        "loaded = [m for m in sys.modules if m.startswith(('eventguard.testing', 'eventguard.demo', "
        "'uvicorn', 'openai', 'agent_framework'))]; print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


async def test_the_tap_passes_every_event_through_records_its_flags_and_closes_once() -> None:
    events = stream_events(2)
    context = host_context()
    signal = asyncio.Event()

    def cancel() -> None:
        signal.set()
        context.client_cancelled = True

    inner = Scripted(events, before={len(events) - 1: cancel})
    seen: list[Seen] = []
    async with aclosing(tap(inner, seen, signal, context)) as tapped:
        passed = [event async for event in tapped]
    assert passed == events and [s.event for s in seen] == events
    assert [s.flags for s in seen] == ["", "", "", "", "SC"]
    assert seen[-1].ending == "completed" and seen[0].ending is None
    assert inner.closes == 1


async def test_the_tap_closes_its_stream_when_it_is_closed_early() -> None:
    inner = Scripted(stream_events(5))
    seen: list[Seen] = []
    async with aclosing(tap(inner, seen)) as tapped:
        async for _event in tapped:
            break
    assert inner.closes == 1 and len(seen) == 1 and seen[0].flags == ""


async def test_the_loopback_server_serves_on_127_0_0_1_and_stops() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async with loopback_server(app, within=10) as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            assert (await client.get("/")).text == "ok"
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            await client.get("/")


async def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="waiting for the impossible"):
        await wait_until(lambda: False, "the impossible", within=0.05)
