"""A task cancelled in the middle of a statement on eventguard's SQLite engine leaves the file
writable.

SQLAlchemy invalidates a connection whose statement a cancel interrupted, and closes it. A statement
left unfinished there kept sqlite3's close from happening while its cursor lived (a "zombie"
connection): the connection lingered with its transaction and the file's write lock, and every
other writer waited out its busy timeout, "database is locked". Seen in CI as a flake: a replica's
settlement, cancelled by ``Replica.stop()`` at shutdown, and then the next write to the file failed
30 s later. The engine now rolls an invalidated connection back, on its driver's thread, before it is
closed.

The cancel is swept over the settlement's event-loop turns (as a shutdown lands anywhere): the
settlement renews its lease and reads the stored response in transactions of the engine, back to
back while the replica stops. Before the fix, 4 to 48 of 150 turns left the file locked for good
(60 s and a garbage collection later, still locked).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from azure.ai.agentserver.responses._response_context import ResponseContext
from azure.ai.agentserver.responses.models.runtime import ResponseModeFlags

from eventguard.provider import SqlResponseProvider
from eventguard.replicas import ReplicaOptions
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import Replica

#: Event-loop turns after which the settlement is cancelled (failures were seen from turn 28 on).
TURNS = range(0, 120)


def writable(path: Path) -> bool:
    """Whether another connection takes the file's write lock within a second."""
    probe = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


async def test_a_settlement_cancelled_at_any_turn_leaves_the_file_writable(tmp_path: Path) -> None:
    path = tmp_path / "settled.db"
    url = f"sqlite:///{path}"
    provider = FencedResponseProvider(url)
    writer = SqlResponseProvider(url)  # the host's store-only writes, as another process makes them
    replica = Replica(ReplicaOptions(identity="owner", lease=2.0, heartbeat=0.05), provider)
    locked: list[int] = []
    try:
        async with asyncio.timeout(240):
            await provider.start()
            await writer.start()
            replica._stopping.set()  # as stop() does: the stored response is looked at every turn
            for turns in TURNS:
                rid = f"resp_turn_{turns}"
                flags = ResponseModeFlags(stream=False, store=True, background=True)
                context = ResponseContext(response_id=rid, mode_flags=flags)
                await replica.claim_run(rid, context)
                envelope = {"id": rid, "object": "response", "status": "in_progress", "output": []}
                await writer.create_response(envelope, [], [])
                replica.settle_later(rid, context)
                for _ in range(turns):
                    await asyncio.sleep(0)
                settling = list(replica._settling)
                for task in settling:
                    task.cancel()
                await asyncio.gather(*settling, return_exceptions=True)
                if not await asyncio.to_thread(writable, path):
                    locked.append(turns)
                    break  # every later turn would wait out the lock too
    finally:
        async with asyncio.timeout(60):
            await writer.aclose()
            await provider.aclose()
    assert locked == [], f"the file stayed locked after a cancel at turn {locked[0]}"
