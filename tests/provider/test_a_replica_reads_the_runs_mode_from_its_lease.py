"""Another replica answers a GET of an in-flight response by the run's mode, which the owner writes on
the lease before the run's first event (migration 0006): a background run is served from the store,
a foreground one is the owner's alone. The sink's row, which also says so, is written a flush interval
later than the envelope, and a GET in between once answered 404 for a background run (CI,
tests/upstream/test_replicas.py::test_a_get_on_another_replica_shows_the_output_stored_so_far_...)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from eventguard.replicas import ReplicaOptions
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import Replica

from .conftest import Database


def _context(response_id: str, background: bool) -> SimpleNamespace:
    """The host's response context, as far as a replica reads it."""
    return SimpleNamespace(
        response_id=response_id, user_id_key=None, mode_flags=SimpleNamespace(background=background)
    )


@pytest.mark.parametrize("claimed_for_its_post", [False, True], ids=["server_id", "client_id"])
async def test_another_replica_tells_a_background_run_from_a_foreground_one_before_the_sink_writes(
    sql_database: Database, claimed_for_its_post: bool
) -> None:
    assert sql_database.url is not None
    providers = [FencedResponseProvider(sql_database.url, schema=sql_database.schema) for _ in range(2)]
    owner, other = (
        Replica(ReplicaOptions(identity=name), p) for name, p in zip("ab", providers, strict=True)
    )
    async with asyncio.timeout(60):
        for p in providers:
            await p.start()
        try:
            for rid, background in (("resp_bg", True), ("resp_fg", False)):
                if claimed_for_its_post:  # x-agent-response-id: the middleware claims before the host runs it
                    assert await owner.claim_id(rid, None)
                await owner.claim_run(rid, _context(rid, background))
                envelope = {"id": rid, "object": "response", "status": "in_progress", "output": []}
                await providers[0].create_response(envelope, [], [])  # no sink row for either yet
            assert await other.running_elsewhere("resp_bg", None)
            assert not await other.foreground_elsewhere("resp_bg", None)  # served: 200 in_progress
            assert await other.foreground_elsewhere("resp_fg", None)  # the owner's alone: 404
            assert not await owner.foreground_elsewhere("resp_fg", None)  # not elsewhere for its owner
        finally:
            for p in providers:
                await p.aclose()
