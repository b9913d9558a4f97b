"""Concurrent first calls on an empty database create the schema once: none of them fails.

The host calls a provider it was given with no ``start()``; its first requests arrive together.
Found by upstream's own store tests (scripts/upstream_store_tests.py): two first calls each ran
Alembic's upgrade and the interleaved upgrades failed both (SchemaMismatchError, KeyError 'config').
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from eventguard.provider import SqlResponseProvider

from .conftest import Database, ctx
from .test_parity_with_the_hosts_store import envelope, item

ROOT = Path(__file__).resolve().parents[2]


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


async def test_first_calls_of_several_providers_on_one_empty_database_all_succeed(
    sql_database: Database,
) -> None:
    """Several providers of one process (a sink's and a store's, two hosts' of one app) start
    together: one migration at a time, whatever the engine (Alembic's context is process-global),
    and the others find the schema made instead of taking its tables for someone else's."""
    assert sql_database.url is not None
    providers = [SqlResponseProvider(sql_database.url, schema=sql_database.schema) for _ in range(6)]
    ids = [[f"resp_p{p}_{n}" for n in range(3)] for p in range(len(providers))]
    try:
        async with asyncio.timeout(120):
            made = await asyncio.gather(
                *(
                    provider.create_response(envelope(r), [item(f"{r}_in")], [], context=ctx(None))
                    for provider, mine in zip(providers, ids, strict=True)
                    for r in mine
                ),
                return_exceptions=True,
            )
            assert [m for m in made if m is not None] == []
            for provider, mine in zip(providers, ids, strict=True):
                assert [(await provider.get_response(r, context=ctx(None)))["id"] for r in mine] == mine
    finally:
        async with asyncio.timeout(30):
            for provider in providers:
                await provider.aclose()


async def test_first_calls_from_several_processes_on_one_empty_database_all_succeed(
    sql_database: Database,
) -> None:
    """Three processes' first calls at once on one empty database (PostgreSQL: an advisory lock
    around the migration; SQLite: its write lock): each process's four calls succeed."""
    assert sql_database.url is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    try:
        async with asyncio.timeout(180):
            for n in range(3):
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "tests.provider._first_call_child",
                        sql_database.url,
                        sql_database.schema or "-",
                        f"proc{n}",
                        cwd=ROOT,
                        env=env,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.STDOUT,
                    )
                )
            for proc in procs:
                assert proc.stdout is not None
                assert (await proc.stdout.readline()).decode().strip() == "ready"
            for proc in procs:  # all at once: every child is waiting for this line
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            outputs = [(await proc.communicate())[0].decode() for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                async with asyncio.timeout(30):
                    await proc.wait()
