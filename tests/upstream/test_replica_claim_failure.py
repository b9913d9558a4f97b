"""A run whose lease the database cannot claim is failed inside its guard: recorded and answered
``failed``, never lost (``eventguard.replicas``; issue 16). The fault is real: the lease table is gone
from the SQLite file under a running replica, so the claim's statement fails as in an outage."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import pytest

from eventguard.foundry import GuardedResponsesHostServer, _store_keyword
from eventguard.replicas import ReplicaOptions
from eventguard.testing import ScriptedChatClient, chat_agent

pytestmark = [pytest.mark.upstream]


async def test_a_run_whose_lease_cannot_be_claimed_is_recorded_and_answered_failed(tmp_path: Path) -> None:
    path = tmp_path / "claim.db"
    agent, _ = chat_agent(ScriptedChatClient(("never shown",)))
    server = GuardedResponsesHostServer(
        agent, database=f"sqlite:///{path}", replicas=ReplicaOptions(lease=30.0), configure_observability=None
    )
    storage = server.eventguard_storage
    assert storage is not None and storage.replica is not None
    transport = httpx.ASGITransport(app=server)
    async with asyncio.timeout(60), server.router.lifespan_context(server):
        with sqlite3.connect(path) as db:  # the outage: the claim's table is gone
            db.execute("DROP TABLE eventguard_leases")
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
            answer = await http.post("/responses", json={"model": "m", "input": "hi", "stream": False})
        # Answered truthfully: the host's own answer to a handler that failed before its first event.
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "server_error", answer.text
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT status, error_message FROM eventguard_responses").fetchall()
    assert len(rows) == 1, rows  # recorded: the guard saw the run
    status, message = rows[0]
    assert status == "failed" and "could not claim the lease" in message, rows


@pytest.mark.parametrize("keyword", ["response_store", "store"])
def test_replicas_with_the_applications_own_store_are_refused_by_name(keyword: str, tmp_path: Path) -> None:
    """Replicas serve every response from eventguard's SQL store, which their leases fence: the
    application's own store was silently replaced (without replicas= it is kept, as documented)."""
    from azure.ai.agentserver.responses.store._memory import InMemoryResponseProvider

    agent, _ = chat_agent()
    mine = InMemoryResponseProvider()
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    with pytest.raises(ValueError, match=rf"cannot be combined with {keyword}="):
        GuardedResponsesHostServer(
            agent, database=url, replicas=ReplicaOptions(), configure_observability=None, **{keyword: mine}
        )
    # Without replicas= the store is kept, under the keyword this host takes (1.0.0b260918: store).
    own = _store_keyword()
    kept = GuardedResponsesHostServer(agent, database=url, configure_observability=None, **{own: mine})
    assert kept.eventguard_storage is not None and kept.eventguard_storage.provider is None
