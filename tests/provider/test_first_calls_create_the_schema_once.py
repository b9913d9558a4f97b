"""Concurrent first calls on an empty database create the schema once: none of them fails.

The host calls a provider it was given with no ``start()``; its first requests arrive together.
Found by upstream's own store tests (scripts/upstream_store_tests.py): two first calls each ran
Alembic's upgrade and the interleaved upgrades failed both (SchemaMismatchError, KeyError 'config').
"""

from __future__ import annotations

import asyncio

from eventguard.provider import SqlResponseProvider

from .conftest import Database, ctx
from .test_parity_with_the_hosts_store import envelope, item


async def test_concurrent_first_calls_on_an_empty_database_all_succeed(sql_database: Database) -> None:
    assert sql_database.url is not None
    provider = SqlResponseProvider(sql_database.url, schema=sql_database.schema)
    try:
        ids = [f"caresp_first{i:02d}" for i in range(8)]
        async with asyncio.timeout(120):
            await asyncio.gather(
                *(
                    provider.create_response(envelope(r), [item(f"{r}_in")], [], context=ctx(None))
                    for r in ids
                )
            )
            got = [await provider.get_response(r, context=ctx(None)) for r in ids]
        assert [g["id"] for g in got] == ids
    finally:
        async with asyncio.timeout(30):
            await provider.aclose()
