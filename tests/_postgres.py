"""The PostgreSQL server the suites share (127.0.0.1:5432, trust auth, database ``test``).

Each test that needs it gets a fresh schema of its own (:func:`fresh_schema`), dropped after; it skips,
saying why, only where no server is reachable.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def unreachable() -> str | None:
    """Why no PostgreSQL server answers at ``PG_DSN``, or None when one does."""
    import asyncpg  # type: ignore[import-untyped]  # the postgres extra: imported only when asked

    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(PG_DSN)
            await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"no PostgreSQL at {PG_DSN}: {type(exc).__name__}: {exc}"
    return None


async def execute(sql: str, *args: Any) -> Any:
    """Run one statement on a connection of its own; its rows."""
    import asyncpg

    async with asyncio.timeout(30):
        conn = await asyncpg.connect(PG_DSN)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()


@asynccontextmanager
async def fresh_schema(prefix: str) -> AsyncIterator[str]:
    """A new schema named ``<prefix>_<random>``, dropped afterwards; skips (with the reason) when no
    server is reachable."""
    why = await unreachable()
    if why is not None:
        pytest.skip(why)
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        await execute(f'DROP SCHEMA "{schema}" CASCADE')
