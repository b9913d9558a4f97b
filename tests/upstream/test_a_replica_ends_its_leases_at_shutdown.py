"""A graceful shutdown of a replica (the server's lifespan, in-process, on the real host) leaves no
lease ``running`` for a run that ended just before it, when its stored envelope is terminal.

A user's background run (``x-agent-user-id``) is leased in the user's partition, where the host
stores it, so the host's own terminal write ends the lease under its token. This test is about the
other terminal: one stored *without* this replica's token (another process's store, a store-only
path), which does not end the lease; the settlement would, after one lease. Here the host's terminal
``update_response`` is handed to a plain ``SqlResponseProvider`` on the same database (real, no
token). Before ``Replica.stop`` settled the leases (``_stop_settling``), the shutdown cancelled that
settlement with the event loop: the lease stayed ``running`` until it expired, and another replica's
reaper then ended a completed response ``failed``/``owner_lost``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from azure.ai.agentserver.responses import ResponsesServerOptions

from eventguard.envelopes import key as row_key
from eventguard.foundry import GuardedResponsesHostServer
from eventguard.provider import SqlResponseProvider
from eventguard.replicas import ReplicaOptions
from eventguard.replicas.fenced import TERMINAL
from eventguard.testing import ScriptedChatClient, chat_agent

pytestmark = [pytest.mark.upstream]

USER = "alice"


def _of_a_replica(task: asyncio.Task[Any]) -> bool:
    return task is not asyncio.current_task() and task.get_coro().__qualname__.startswith("Replica.")


def _terminals_stored_without_the_token(fenced: Any, writer: SqlResponseProvider) -> list[str]:
    """Hand the host's terminal writes to ``writer`` (a store without this replica's token);
    the ids it wrote are returned (filled in as the host writes)."""
    written: list[str] = []
    fenced_update = fenced.update_response

    async def update_response(response: Any, *, context: Any = None) -> None:
        if isinstance(response, dict) and response.get("status") in TERMINAL:
            written.append(str(response.get("id")))
            await writer.update_response(response, context=context)
        else:
            await fenced_update(response, context=context)

    fenced.update_response = update_response
    return written


async def test_a_run_whose_terminal_was_stored_without_the_token_has_its_lease_ended_at_shutdown(
    tmp_path: Path,
) -> None:
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
    assert storage is not None and storage.replica is not None and storage.provider is not None
    replica = storage.replica
    writer = SqlResponseProvider(f"sqlite:///{path}")
    written = _terminals_stored_without_the_token(storage.provider, writer)
    transport = httpx.ASGITransport(app=server)
    user = {"x-agent-user-id": USER}
    async with asyncio.timeout(60):
        async with server.router.lifespan_context(server):
            await writer.start()
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
                    body = {"model": "m", "input": "hi", "background": True}
                    answer = await http.post("/responses", json=body, headers=user)
                    assert answer.status_code == 200, answer.text
                    rid = answer.json()["id"]
                    while (await http.get(f"/responses/{rid}", headers=user)).json()["status"] != "completed":  # noqa: ASYNC110 - the host's state
                        await asyncio.sleep(0.05)
                    while rid not in written:  # noqa: ASYNC110 - the host's write, after its state
                        await asyncio.sleep(0.05)
                # One lease, in the user's partition (where the host stores the run), still held:
                # the terminal was stored without its token.
                assert set(replica.tokens) == {(row_key(USER), row_key(rid))}
            finally:
                await writer.aclose()
        # What the end of uvicorn's event loop does to the tasks still running.
        left = [task for task in asyncio.all_tasks() if _of_a_replica(task)]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
    with sqlite3.connect(path) as db:
        leases = db.execute(
            "SELECT partition, state FROM eventguard_leases WHERE response_id = ?", (f'"{rid}"',)
        )
        assert [tuple(row) for row in leases] == [(row_key(USER), "ended")]
        stored = db.execute(
            "SELECT partition, status FROM eventguard_provider_responses WHERE response_key = ?",
            (row_key(rid),),
        )
        assert [tuple(row) for row in stored] == [(row_key(USER), "completed")]
        status = db.execute("SELECT status FROM eventguard_responses WHERE response_id = ?", (rid,))
        assert [row[0] for row in status] == ["completed"]
