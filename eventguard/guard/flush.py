"""The guard's final flush: the recorder's ``close()``, shielded and bounded in time.

Shielded, so that the terminal write survives the cancellation of the task running the guard;
bounded, so that a database that hangs cannot hang the host: after ``within`` seconds the guard goes on and
the write goes on in the background (kept alive by :func:`~eventguard.guard.inner.spawn`).
"""

from __future__ import annotations

import asyncio
import logging

from eventguard.guard.inner import spawn
from eventguard.recording import Recorder

__all__ = ["flush"]

log = logging.getLogger("eventguard.guard")


async def flush(rec: Recorder, within: float, response_id: str | None) -> None:
    """Close ``rec`` (its final flush), waiting at most ``within`` seconds for it; ``response_id``
    names the response in the warning logged when the flush outlives the wait."""
    closing = spawn(rec.close())
    try:
        await asyncio.wait_for(asyncio.shield(closing), within)
    except TimeoutError:
        log.warning(
            "eventguard: final flush of %s still running after %.1fs; continuing in the background",
            response_id,
            within,
        )
