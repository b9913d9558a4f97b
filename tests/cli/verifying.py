"""What the ``verify`` tests share: a bounded event loop, a change to stored rows, ``verify``'s report
(checked against the typed path), and ``eventguard verify --json``'s answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from typer.testing import CliRunner

from eventguard.cli import app
from eventguard.store import ResponseStore
from eventguard.verify import VerifyReport, check_history, verify

from .conftest import STEP

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """One bounded event loop of its own (the CLI, called between, runs its own)."""

    async def bounded() -> T:
        async with asyncio.timeout(STEP):
            return await coro

    return asyncio.run(bounded())


async def alter(url: str, schema: str | None, *statements: Any) -> None:
    """Change stored rows (a history that disagrees), in one transaction."""
    async with ResponseStore(url, schema=schema) as store, store.engine.begin() as conn:
        for statement in statements:
            await conn.execute(statement)


async def verified(url: str, schema: str | None) -> VerifyReport:
    """``verify``'s report, after checking that the typed path (``check_history`` of each
    ``History``) says the same as verify's row path."""
    async with ResponseStore(url, schema=schema) as store:
        report = await verify(store)
        typed = [d for h in [h async for h in store.histories()] for d in check_history(h)]
    assert tuple(typed) == report.disagreements
    return report


def cli_verify(url: str, schema: str | None) -> tuple[int, dict[str, Any]]:
    """``eventguard verify --json``: its exit code and what it printed."""
    argv = ["verify", "--json", "--database-url", url, *(["--schema", schema] if schema else [])]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)
