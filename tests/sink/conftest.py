"""Fixtures: a real SQLite file per test, and a fresh PostgreSQL schema per test (dropped after)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Target:
    kind: str
    url: str
    schema: str | None
    spool: Path


async def _pg_reachable() -> str | None:
    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(PG_DSN)
            await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"no PostgreSQL at {PG_DSN}: {type(exc).__name__}: {exc}"
    return None


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    why = await _pg_reachable()
    if why is not None:
        pytest.skip(why)
    schema = f"eg_test_{uuid.uuid4().hex[:12]}"
    async with asyncio.timeout(10):
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.close()
    try:
        yield schema
    finally:
        async with asyncio.timeout(30):
            conn = await asyncpg.connect(PG_DSN)
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()


@pytest.fixture
def sqlite_target(tmp_path: Path) -> Target:
    return Target("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", None, tmp_path / "spool.jsonl")


@pytest.fixture
def pg_target(pg_schema: str, tmp_path: Path) -> Target:
    return Target("postgres", PG_URL, pg_schema, tmp_path / "spool.jsonl")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest) -> Target:
    name = "sqlite_target" if request.param == "sqlite" else "pg_target"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]
