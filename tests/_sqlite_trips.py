"""Counting trips to aiosqlite's thread: each is a hand-off between the event loop and that thread.

Shared by the sink's and the provider's SQLite tests, which count trips instead of timing them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import aiosqlite
import pytest


@contextlib.contextmanager
def trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every function aiosqlite runs in its thread, in order, while inside."""
    seen: list[str] = []
    real: Any = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(fn.func.__name__ if isinstance(fn, partial) else getattr(fn, "__name__", repr(fn)))
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    try:
        yield seen
    finally:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", real)
