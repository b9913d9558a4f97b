"""Shared pieces of the reliability suite: slow gating, figures, database targets."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._postgres import PG_DSN, PG_URL, fresh_schema
from tests._postgres import execute as pg_execute
from tests._postgres import unreachable as pg_unreachable

__all__ = ["PG_DSN", "PG_URL", "pg_execute", "pg_unreachable"]  # the suite reads them from here

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


def pg_schema() -> AbstractAsyncContextManager[str]:
    """A fresh schema, dropped afterwards; skips (with the reason) when no server answers."""
    return fresh_schema("eg_rel")


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
