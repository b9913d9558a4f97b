"""The stores under test: the host's in-memory provider (the reference) and SqlResponseProvider on a
real SQLite file and a fresh PostgreSQL schema (dropped after)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from azure.ai.agentserver.responses import InMemoryResponseProvider, PlatformContext

from eventguard.provider import SqlResponseProvider
from tests._postgres import PG_URL, fresh_schema

#: 2.4.0b1 changed the in-memory store: partitions by user, de-duplicated history, ``-1`` = all.
#: The SQL store keeps those rules on both ends; the 2.2.0b1 reference is skipped for them.
HOST = tuple(int(p) for p in version("azure-ai-agentserver-responses").split(".")[:2])
OLD_MEMORY = HOST < (2, 4)


@dataclass
class Store:
    """One store under test, and how to build a second view of the same data (another process)."""

    kind: str
    provider: Any
    url: str | None = None
    schema: str | None = None

    @property
    def sql(self) -> bool:
        return self.kind != "memory"

    def another(self) -> SqlResponseProvider:
        """A second provider on the same database, as another process would open it."""
        assert self.url is not None
        return SqlResponseProvider(self.url, schema=self.schema)


def ctx(user: str | None) -> PlatformContext:
    """The host's context for a user (``None``: anonymous)."""
    return PlatformContext(user_id_key=user)


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    async with fresh_schema("eg_prov") as schema:
        yield schema


@dataclass(frozen=True)
class Database:
    kind: str
    url: str | None
    schema: str | None


def _database(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if kind == "memory":
        return Database(kind, None, None)
    if kind == "sqlite":
        return Database(kind, f"sqlite:///{tmp_path / 'provider.db'}", None)
    return Database(kind, PG_URL, request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    return _database(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    return _database(request.param, request, tmp_path)


async def _open(db: Database) -> AsyncIterator[Store]:
    if db.url is None:
        yield Store("memory", InMemoryResponseProvider())
        return
    provider = SqlResponseProvider(db.url, schema=db.schema)
    async with asyncio.timeout(60):
        await provider.start()
    try:
        yield Store(db.kind, provider, db.url, db.schema)
    finally:
        async with asyncio.timeout(30):
            await provider.aclose()


@pytest.fixture
async def sqlite_provider(tmp_path: Path) -> AsyncIterator[SqlResponseProvider]:
    """The SQL provider alone on a fresh SQLite file, started; closed after the test."""
    async for made in _open(Database("sqlite", f"sqlite:///{tmp_path / 'provider.db'}", None)):
        yield made.provider


@pytest.fixture
async def store(any_database: Database) -> AsyncIterator[Store]:
    """Each parity case runs against the host's in-memory provider and the SQL one on both databases."""
    async for made in _open(any_database):
        yield made


@pytest.fixture
async def sql_store(sql_database: Database) -> AsyncIterator[Store]:
    """The SQL provider alone, on both databases (what the in-memory one has no counterpart for)."""
    async for made in _open(sql_database):
        yield made


def newest_rules(store: Store) -> None:
    """Skip the 2.2.0b1 in-memory reference for a rule it did not have yet."""
    if store.kind == "memory" and OLD_MEMORY:
        pytest.skip("2.2.0b1's in-memory store predates this rule; the SQL store keeps it on both ends")
