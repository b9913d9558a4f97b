"""Shared pieces of the reliability suite: slow gating, figures, database targets."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"

SLOW = os.environ.get("EVENTGUARD_SLOW") == "1"
#: Long-running parts: run by `bash scripts/reliability.sh slow`, skipped (saying so) otherwise.
slow = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not SLOW, reason="slow reliability part: set EVENTGUARD_SLOW=1 (scripts/reliability.sh slow)"
    ),
]

#: Figures collected during the run; printed in the terminal summary and appended to a JSON-lines
#: file when EVENTGUARD_RELIABILITY_REPORT names one (scripts/reliability.sh sums them up).
FIGURES: list[dict[str, Any]] = []


def report(part: str, **figures: Any) -> None:
    line = {"part": part, **figures}
    FIGURES.append(line)
    path = os.environ.get("EVENTGUARD_RELIABILITY_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str) + "\n")


@dataclass(frozen=True)
class Db:
    kind: str  # "sqlite" | "postgres"
    url: str
    schema: str | None
    spool: Path
    path: Path | None = None  # the SQLite file


async def pg_unreachable() -> str | None:
    import asyncpg  # type: ignore[import-untyped]

    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(PG_DSN)
            await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"no PostgreSQL at {PG_DSN}: {type(exc).__name__}: {exc}"
    return None


async def pg_execute(sql: str, *args: Any) -> Any:
    import asyncpg

    async with asyncio.timeout(30):
        conn = await asyncpg.connect(PG_DSN)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A fresh schema, dropped afterwards; skips (with the reason) when no server answers."""
    why = await pg_unreachable()
    if why is not None:
        pytest.skip(why)
    schema = f"eg_rel_{uuid.uuid4().hex[:12]}"
    await pg_execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        await pg_execute(f'DROP SCHEMA "{schema}" CASCADE')


@asynccontextmanager
async def database(kind: str, tmp: Path) -> AsyncIterator[Db]:
    if kind == "sqlite":
        path = tmp / f"eg-{uuid.uuid4().hex[:8]}.db"
        yield Db("sqlite", f"sqlite+aiosqlite:///{path}", None, tmp / f"{path.name}.spool.jsonl", path)
        return
    async with pg_schema() as schema:
        yield Db("postgres", PG_URL, schema, tmp / f"pg-{schema}.spool.jsonl")


async def kill_pg_connections(owner: str) -> int:
    """Terminate the server side of every connection a sink (by its owner) holds."""
    rows = await pg_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        f"eventguard {owner}"[:63],
    )
    return len(rows)
