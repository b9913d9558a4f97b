"""A graceful shutdown of a replica (the server's lifespan, in-process, on the real host) leaves no
lease ``running`` for a run that ended just before it, when its stored envelope is terminal.

The run here is a background one of a user (``x-agent-user-id``): its envelope is stored in the user's
partition, while the replica holds its lease in another (``Replica.claim_run`` reads the user key
from the context itself, where the host's ``ResponseContext`` has it in ``platform_context``), so the
host's terminal write does not end the lease; the settlement would, after one lease. Before, the
shutdown cancelled that settlement with the event loop: the lease stayed ``running`` until it
expired, and another replica's reaper then ended a completed response ``failed``/``owner_lost``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from azure.ai.agentserver.responses import ResponsesServerOptions

from eventguard.foundry import GuardedResponsesHostServer
from eventguard.replicas import ReplicaOptions
from eventguard.testing import ScriptedChatClient, chat_agent

pytestmark = [pytest.mark.upstream]


def _of_a_replica(task: asyncio.Task[Any]) -> bool:
    return task is not asyncio.current_task() and task.get_coro().__qualname__.startswith("Replica.")


async def test_a_run_that_ended_just_before_shutdown_has_its_lease_ended(tmp_path: Path) -> None:
    path = tmp_path / "replica.db"
    agent, _ = chat_agent(ScriptedChatClient(("done",)))
    server = GuardedResponsesHostServer(
        agent,
        database=f"sqlite:///{path}",
        replicas=ReplicaOptions(lease=30.0),  # no look at the store before the shutdown
        options=ResponsesServerOptions(shutdown_grace_period_seconds=2),
        configure_observability=None,
    )
    storage = server.eventguard_storage
    assert storage is not None and storage.replica is not None
    replica = storage.replica
    transport = httpx.ASGITransport(app=server)
    user = {"x-agent-user-id": "alice"}
    async with asyncio.timeout(60):
        async with server.router.lifespan_context(server):
            async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
                body = {"model": "m", "input": "hi", "background": True}
                answer = await http.post("/responses", json=body, headers=user)
                assert answer.status_code == 200, answer.text
                rid = answer.json()["id"]
                while (await http.get(f"/responses/{rid}", headers=user)).json()["status"] != "completed":  # noqa: ASYNC110 - the host's state
                    await asyncio.sleep(0.05)
            assert replica.tokens, "the lease is still held after the terminal (see the docstring)"
        # What the end of uvicorn's event loop does to the tasks still running.
        left = [task for task in asyncio.all_tasks() if _of_a_replica(task)]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
    with sqlite3.connect(path) as db:
        leases = db.execute("SELECT state FROM eventguard_leases WHERE response_id = ?", (f'"{rid}"',))
        assert [row[0] for row in leases] == ["ended"]
        status = db.execute("SELECT status FROM eventguard_responses WHERE response_id = ?", (rid,))
        assert [row[0] for row in status] == ["completed"]
