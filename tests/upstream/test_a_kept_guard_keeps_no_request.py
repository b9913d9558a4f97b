"""A finished response's guard, kept for ``guard_for()``, keeps what it reports and not the request.

``GuardedResponses`` keeps the last ``eventguard_keep_guards`` guards (256 by default) by response id.
Each held the host's ``ResponseContext`` (the parsed request: its whole input, its headers), the inner
stream, the recorder and the last response snapshot: a 1 MB input stayed in memory 256 times over,
and every kept object made each full garbage collection longer. A finished guard now lets go of all
of it and keeps its lifecycle.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_framework_foundry_hosting import ResponsesHostServer

from eventguard import State
from eventguard.foundry import GuardedResponses
from eventguard.sink import SqlSink
from eventguard.testing import ScriptedChatClient, chat_agent

pytestmark = [pytest.mark.upstream]


class _Server(GuardedResponses, ResponsesHostServer):  # type: ignore[misc,unused-ignore]
    """Notes each response's id and a weak reference to its context, and nothing more."""

    contexts: list[tuple[str, weakref.ref[Any]]]

    async def _handle_response(
        self, request: Any, context: Any, cancellation_signal: Any
    ) -> AsyncIterator[Any]:
        self.contexts.append((context.response_id, weakref.ref(context)))
        async for event in super()._handle_response(request, context, cancellation_signal):
            yield event


@pytest.mark.parametrize("with_sink", [False, True], ids=["no-sink", "sqlite-sink"])
@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
async def test_a_finished_responses_guard_is_kept_without_its_request(
    tmp_path: Path, stream: bool, with_sink: bool
) -> None:
    sink = (
        SqlSink(f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")
        if with_sink
        else None
    )
    agent, _probe = chat_agent(ScriptedChatClient(("a ", "b ")))
    server = _Server(agent, sink=sink, configure_observability=None)
    server.contexts = []
    big = "x" * 1_000_000 + "\x00\udcff\x1b[31m"  # 1 MB, and what a careless client sends besides
    try:
        async with (
            asyncio.timeout(60),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://host") as client,
        ):
            if sink is not None:
                await sink.start()
            # json.dumps escapes the lone surrogate (httpx's json= would refuse to encode it).
            body = json.dumps({"model": "m", "input": big, "stream": stream})
            headers = {"content-type": "application/json"}
            reply = await client.post("/responses", content=body, headers=headers)
            assert reply.status_code == 200, reply.text[:500]
            await asyncio.sleep(0)
    finally:
        if sink is not None:
            await sink.aclose()
    ((response_id, noted),) = server.contexts
    gc.collect()
    kept = server.guard_for(response_id)
    assert kept is not None and kept.lifecycle.state is State.COMPLETED
    assert kept.inner_closed == 1
    assert noted() is None, "the kept guard still holds the response's context (and with it the request)"
