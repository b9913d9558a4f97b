"""A database that cannot be reached is said as one, by type: ``DatabaseUnavailableError``.

``SqlSink.start()``, ``SqlResponseProvider.start()`` and ``ResponseStore``'s calls raised whatever the
driver raised (``ConnectionRefusedError``, asyncpg's ``InvalidPasswordError``, SQLAlchemy's
``OperationalError``, a ``TimeoutError``), so an application had to know every driver's errors to
tell "the database is away" from a bug. Now each is a :class:`~eventguard.DatabaseUnavailableError`
(a ``StorageError``), naming the database without its password, chained from the driver's error.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventguard import DatabaseUnavailableError, ResponseStore, SqlResponseProvider, SqlSink, StorageError

STEP = 30.0
SECRET = "s3cr3t-pw"


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A PostgreSQL URL on a loopback port nothing listens on (bound, never listened: refused)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"postgresql://app:{SECRET}@127.0.0.1:{held.getsockname()[1]}/prod"


def _sink(url: str, tmp_path: Path) -> Any:
    return SqlSink(url, spool_path=tmp_path / "spool.jsonl", connect_timeout=2.0)


async def _start(made: Any) -> None:
    await made.start()


async def _read(made: Any) -> None:
    await made.get("resp_1")


CASES: list[tuple[str, Callable[[str, Path], Any], Callable[[Any], Any]]] = [
    ("sink.start", _sink, _start),
    ("provider.start", lambda url, _tmp: SqlResponseProvider(url, connect_timeout=2.0), _start),
    ("store.get", lambda url, _tmp: ResponseStore(url), _read),
]


@pytest.mark.parametrize(("_name", "build", "call"), CASES, ids=[c[0] for c in CASES])
async def test_a_refused_connection_is_a_database_unavailable_error_without_the_password(
    refused_url: str,
    tmp_path: Path,
    _name: str,
    build: Callable[[str, Path], Any],
    call: Callable[[Any], Any],
) -> None:
    made = build(refused_url, tmp_path)
    try:
        async with asyncio.timeout(STEP):
            with pytest.raises(DatabaseUnavailableError) as raised:
                await call(made)
    finally:
        async with asyncio.timeout(STEP):
            await made.aclose()
    error = raised.value
    assert isinstance(error, StorageError)
    assert isinstance(error.__cause__, Exception) and not isinstance(error.__cause__, StorageError)
    text = str(error)
    assert SECRET not in text
    assert "127.0.0.1" in text and "ConnectionRefusedError" in text, text


def test_a_lost_race_is_not_a_database_away() -> None:
    """A deadlock or a serialization failure goes through when done again: raised as it is."""
    import asyncpg  # type: ignore[import-untyped]

    from eventguard.sql.classify import unavailable

    url = "postgresql://app@db.example/prod"
    for lost in (
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.SerializationError("could not serialize access"),
    ):
        assert unavailable(url, lost) is None
    assert isinstance(unavailable(url, ConnectionRefusedError(111, "refused")), DatabaseUnavailableError)
