"""The event loop an engine's pooled connections belong to, and letting go of them when it changes.

An asyncpg connection belongs to the loop that opened it: used from another loop (a store used in
one ``asyncio.run()`` and then the next), its first use fails ("Event loop is closed", "attached
to a different loop"). SQLAlchemy's guidance for an engine moving between loops: dispose of its
pool first, with ``close=False`` (the old loop's connections cannot be closed from the new one;
they are dereferenced, and the new loop opens its own). That is synchronous (no I/O), so no other
task of the new loop sees the old pool after it.

Only for a pool its user owns: an application's engine lent to eventguard keeps its pool, its
owner's to dispose of between loops.
"""

from __future__ import annotations

import asyncio
import weakref

from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.sql.engine import let_go

__all__ = ["PoolLoop"]


class PoolLoop:
    """Which event loop last used a pool (weakly: a finished loop is not kept alive)."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def moved(self) -> bool:
        """Note the running loop; True when another loop used the pool before it (never on the
        first use). Must be called with a loop running."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop() is loop:
            return False
        first, self._loop = self._loop is None, weakref.ref(loop)
        return not first

    def follow(self, engine: AsyncEngine | None) -> bool:
        """:meth:`moved`, and if so let go of ``engine``'s pool (``close=False``; None: nothing to
        let go of, an engine not built yet or not the caller's). True when the loop changed."""
        if not self.moved():
            return False
        if engine is not None:
            let_go(engine)
        return True
