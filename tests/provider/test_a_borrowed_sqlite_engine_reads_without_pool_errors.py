"""``SqlResponseProvider(engine)`` over an application's SQLite engine whose URL its own reader cannot
open (a URI filename): each ``get_response`` returned its connection to the application's pool with a
synchronous close, and the pool's reset logged ``MissingGreenlet`` at ERROR on every read."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from eventguard import SqlResponseProvider


async def test_reads_through_an_applications_sqlite_engine_log_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_async_engine(f"sqlite+aiosqlite:///file:{tmp_path / 'app.db'}?uri=true")
    provider = SqlResponseProvider(app)
    envelope = {"id": "resp_borrowed", "object": "response", "status": "completed", "output": []}
    try:
        async with asyncio.timeout(30):
            await provider.start()
            await provider.create_response(envelope, None, None)
            with caplog.at_level(logging.WARNING):
                for _ in range(5):
                    got = await provider.get_response("resp_borrowed")
                    assert got["id"] == "resp_borrowed"
            await provider.aclose()
    finally:
        await app.dispose()
    # SQLAlchemy's pool (where the reset's error was logged) and eventguard's own loggers: not
    # asyncio's, which may report here a task another test left behind, collected now.
    said = [r for r in caplog.records if r.name.startswith(("sqlalchemy", "eventguard"))]
    assert [r.getMessage() for r in said if r.levelno >= logging.WARNING] == []
