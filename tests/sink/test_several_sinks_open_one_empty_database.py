"""Several sinks opening one empty database at once all start: the schema is made once, and the
others find it made, on SQLite and PostgreSQL.

A sink's first use (``start()``, or the first write of a sink never started) decided "empty
database: create it" from a check made before the migration lock, then looked the tables up again,
outside the lock too: a sink whose check ran before another sink's creation committed, and whose
look-up ran after it, found eventguard's tables without having seen their revision and refused them
as someone else's (``SchemaMismatchError``, "no eventguard schema"). The writer now decides as the
response store does (``eventguard.sql.migrate.first_use``): the decision is taken again under the
migration lock.

The interleaving is made certain, not left to the scheduler: each sink's first check answers what
it read (no schema), but the sinks after the first give that answer only once the schema is made.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SchemaMismatchError
from eventguard.sink import SqlSink
from eventguard.sql import migrate as mig

from .conftest import Target
from .helpers import stored_in_progress

SINKS = 4
T = 120


@pytest.fixture
def first_checks_answer_late(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``migrate.check`` with each engine's first "no schema" answer held back, after the first
    engine's, until the schema is at head (the answer is then stale, as a check made just before
    another sink's creation committed is). Returns the list of what each first check did, in order."""
    real = mig.check
    seen: set[int] = set()
    log: list[str] = []
    all_checked = asyncio.Event()

    async def check(engine: AsyncEngine) -> None:
        try:
            await real(engine)
        except SchemaMismatchError as stale:
            if id(engine) in seen:
                raise
            seen.add(id(engine))
            if len(seen) == SINKS:
                all_checked.set()
            if len(seen) == 1:
                log.append("first: no schema")
                # The first answer waits for every other sink's first check to have read "no
                # schema" too: left to the scheduler, the others may check only after the first
                # made the schema, and the interleaving under test would not happen.
                await all_checked.wait()  # bounded by the test's timeout
                raise
            while True:  # bounded by the test's timeout
                try:
                    await real(engine)
                    break
                except SchemaMismatchError:
                    await asyncio.sleep(0.02)
            log.append("later: no schema, answered once it was made")
            raise stale from None

    monkeypatch.setattr(mig, "check", check)
    return log


@pytest.mark.parametrize("opened_by", ["start", "first write"])
async def test_several_sinks_opening_one_empty_database_all_start(
    target: Target, tmp_path: Path, first_checks_answer_late: list[str], opened_by: str
) -> None:
    """Opened by ``start()``, or by the first write of a sink nobody started (the writer's own
    first use: a sink that refused the tables would spool the write, so the spool is looked at)."""
    sinks = [
        SqlSink(target.url, schema=target.schema, spool_path=tmp_path / f"spool{n}.jsonl")
        for n in range(SINKS)
    ]
    try:
        async with asyncio.timeout(T):
            if opened_by == "start":
                opened = [s.start() for s in sinks]
            else:
                opened = [stored_in_progress(s, f"resp_{n}") for n, s in enumerate(sinks)]
            started = await asyncio.gather(*opened, return_exceptions=True)
            assert [r if isinstance(r, BaseException) else None for r in started] == [None] * SINKS
            assert [(tmp_path / f"spool{n}.jsonl").exists() for n in range(SINKS)] == [False] * SINKS
            assert [s.ready for s in sinks] == [True] * SINKS
            # At least one sink read "no schema" before another made it (a sink whose first
            # check came after the creation committed finds it at head, and is not logged).
            assert first_checks_answer_late[0] == "first: no schema"
            assert "later: no schema, answered once it was made" in first_checks_answer_late
            await mig.check(sinks[0].engine)  # at head
    finally:
        async with asyncio.timeout(30):
            for s in sinks:
                await s.aclose()
