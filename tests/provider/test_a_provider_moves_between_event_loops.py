"""A provider started in one ``asyncio.run()`` and used in the next works there, first call included.

Its pooled connections belong to the loop that opened them; from the next loop the first call
failed with a storage error ("Event loop is closed") on PostgreSQL. The provider now lets go of
its pool when the loop changes (SQLAlchemy's guidance: ``dispose(close=False)``). Real databases,
two real event loops, one after the other (as a CLI, a test runner or a worker's restart does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventguard.provider import SqlResponseProvider
from tests._postgres import sqlite_or_postgres

from .test_parity_with_the_hosts_store import envelope, item, out

T = 60


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(url, schema) of a fresh database, made and dropped outside any test loop."""
    with sqlite_or_postgres(request.param, tmp_path, "eg_loops") as where:
        yield where


def test_a_provider_started_in_one_loop_answers_every_call_in_the_next(
    database: tuple[str, str | None],
) -> None:
    url, schema = database
    provider = SqlResponseProvider(url, schema=schema)

    async def first() -> None:
        async with asyncio.timeout(T):
            await provider.start()
            await provider.create_response(envelope("resp_1"), [item("i1")], None)
            assert (await provider.get_response("resp_1"))["status"] == "in_progress"

    async def second() -> None:
        async with asyncio.timeout(T):
            assert (await provider.get_response("resp_1"))["status"] == "in_progress"
            await provider.update_response(envelope("resp_1", status="completed", output=[out("o1")]))
            assert await provider.get_history_item_ids("resp_1", None, -1) == ["i1", "o1"]
            assert await provider.get_input_items("resp_1") == [item("i1")]

    async def third() -> None:
        async with asyncio.timeout(T):
            await provider.create_response(envelope("resp_2"), [item("i2")], ["i1", "o1"])
            assert await provider.get_items(["i2"]) == [item("i2")]
            await provider.aclose()

    asyncio.run(first())
    asyncio.run(second())
    asyncio.run(third())


def test_a_provider_first_used_in_one_loop_starts_in_the_next(database: tuple[str, str | None]) -> None:
    """Its first loop ended before the schema check did anything more than connect."""
    url, schema = database
    provider = SqlResponseProvider(url, schema=schema)

    async def touch() -> None:
        async with asyncio.timeout(T):
            await provider.start()

    async def use() -> None:
        async with asyncio.timeout(T):
            with pytest.raises(KeyError):
                await provider.get_response("resp_none")
            await provider.create_response(envelope("resp_1"), [item("i1")], None)
            await provider.aclose()

    asyncio.run(touch())
    asyncio.run(use())
