"""On an SQLite file an agent session's write is one hand-off to the response store's writer thread,
as the store's own writes are, and no trip to aiosqlite's thread.

Through the engine each statement of the write was a turn of the event loop with SQLite's write lock
held, and under 16 concurrent responses of a ``database=`` server the sink's and the store's writer
threads waited on it (their ``BEGIN IMMEDIATE`` 130 ms at the p99, 339 ms at worst; the responses'
p99 1.36 s against 0.53 s once the writes moved). Counted, not timed. The conflict rules stay.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from agent_framework import AgentSession
from azure.ai.agentserver.core import FoundryAgentRequestContext

from eventguard.agent_sessions import CONFLICT, SqlAgentSessionStoreProvider
from tests._sqlite_trips import hand_offs, trips


def _ctx() -> FoundryAgentRequestContext:
    return FoundryAgentRequestContext(user_id="u1")


def _session(n: int) -> AgentSession:
    session = AgentSession(session_id="s-1")
    session.state["n"] = n
    return session


async def test_set_and_delete_are_one_hand_off_each_and_no_driver_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = SqlAgentSessionStoreProvider(f"sqlite:///{tmp_path / 's.db'}")
    store = sessions.get_store(config=None, platform_context=_ctx())
    try:
        async with asyncio.timeout(30):
            await sessions.provider.start()
            assert await store.get("conv_1") is None
            with hand_offs(monkeypatch) as handed, trips(monkeypatch) as driver:
                await store.set("conv_1", _session(1))  # the insert where none was read
                await store.set("conv_1", _session(2))  # the update over the version it wrote
                await store.delete("conv_1")
            assert [h.file for h in handed] == ["s.db"] * 3
            assert driver == []
            with sqlite3.connect(tmp_path / "s.db") as raw:
                assert raw.execute("SELECT count(*) FROM eventguard_agent_sessions").fetchone() == (0,)
            # The conflict rules hold on the thread too: a store writing over a version another
            # store advanced is refused with the host's own words.
            first = sessions.get_store(config=None, platform_context=_ctx())
            second = sessions.get_store(config=None, platform_context=_ctx())
            await first.set("conv_2", _session(1))
            assert await first.get("conv_2") is not None and await second.get("conv_2") is not None
            await first.set("conv_2", _session(2))
            with pytest.raises(RuntimeError, match=CONFLICT):
                await second.set("conv_2", _session(3))
            again = await sessions.get_store(config=None, platform_context=_ctx()).get("conv_2")
            assert again is not None and again.state["n"] == 2
    finally:
        async with asyncio.timeout(10):
            await sessions.provider.aclose()
