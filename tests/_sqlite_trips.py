"""Counting trips to a thread, each a hand-off between the event loop and that thread: aiosqlite's
(:func:`trips`) and the jobs handed to eventguard's own SQLite writer thread (:func:`hand_offs`).

Shared by the sink's and the provider's SQLite tests, which count trips instead of timing them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

import aiosqlite
import pytest

from eventguard.sql.sqlite_thread import SqliteThread


@contextlib.contextmanager
def wrapped(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, wrap: Callable[[Any], Any]
) -> Iterator[None]:
    """``owner.name`` replaced by ``wrap(real)`` while inside, the real one put back on the way out
    (not only at the test's end, so what the test does after the block is not counted)."""
    real: Any = getattr(owner, name)
    monkeypatch.setattr(owner, name, wrap(real))
    try:
        yield
    finally:
        monkeypatch.setattr(owner, name, real)


@contextlib.contextmanager
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every function aiosqlite runs in its thread, in order, while inside."""
    seen: list[str] = []

    def wrap(real: Any) -> Any:
        async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(fn.func.__name__ if isinstance(fn, partial) else getattr(fn, "__name__", repr(fn)))
            return await real(self, fn, *args, **kwargs)

        return counted

    with wrapped(monkeypatch, aiosqlite.Connection, "_execute", wrap):
        yield seen


class HandOff(NamedTuple):
    """One job handed to a :class:`SqliteThread`."""

    file: str  #: the name of the thread's database file
    thread: int  #: the ident of the thread the job ran on


@contextlib.contextmanager
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[HandOff]]:
    """Every job handed to a SQLite writer thread while inside (``SqliteThread.call``, which each
    ``transaction`` is one of), noted as it runs there, in order."""
    seen: list[HandOff] = []

    def wrap(real: Any) -> Any:
        async def counted(self: SqliteThread, job: Any) -> Any:
            def watched(conn: Any) -> Any:
                seen.append(HandOff(self.path.name, threading.get_ident()))
                return job(conn)

            return await real(self, watched)

        return counted

    with wrapped(monkeypatch, SqliteThread, "call", wrap):
        yield seen
