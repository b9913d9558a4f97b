"""The PostgreSQL server the suites share (127.0.0.1:5432, trust auth, database ``test``).

Each test that needs it gets a fresh schema of its own (:func:`fresh_schema`, or
:func:`fresh_schema_sync` for sync tests that make event loops of their own), dropped after; it skips,
saying why, only where no server is reachable.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
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


async def _create_schema(prefix: str) -> str:
    """A new schema named ``<prefix>_<random>``; skips (with the reason) when no server is reachable."""
    why = await unreachable()
    if why is not None:
        pytest.skip(why)
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await execute(f'CREATE SCHEMA "{schema}"')
    return schema


@asynccontextmanager
async def fresh_schema(prefix: str) -> AsyncIterator[str]:
    """A new schema named ``<prefix>_<random>``, dropped afterwards; skips (with the reason) when no
    server is reachable."""
    schema = await _create_schema(prefix)
    try:
        yield schema
    finally:
        await execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def fresh_schema_sync(prefix: str) -> Iterator[str]:
    """:func:`fresh_schema` for a sync test or fixture: making and dropping the schema are each an
    ``asyncio.run()`` of their own, so no loop is left open while the test runs loops of its own."""
    schema = asyncio.run(_create_schema(prefix))
    try:
        yield schema
    finally:
        asyncio.run(execute(f'DROP SCHEMA "{schema}" CASCADE'))


@contextmanager
def sqlite_or_postgres(kind: str, folder: Path, prefix: str) -> Iterator[tuple[str, str | None]]:
    """(URL, schema) of a fresh database outside any test loop: ``kind`` ``"sqlite"``, a file in
    ``folder``; else PostgreSQL, a schema of its own, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'{prefix}.db'}", None
        return
    with fresh_schema_sync(prefix) as schema:
        yield PG_URL, schema
