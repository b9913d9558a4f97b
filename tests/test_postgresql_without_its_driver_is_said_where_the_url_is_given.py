"""A PostgreSQL URL where asyncpg is not installed (no ``postgres`` extra) is refused where it is
given, naming the extra: a sink took the first connection's ``ModuleNotFoundError`` for an outage and
spooled every response "until the database is back"."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from eventguard import ResponseStore, SqlResponseProvider, SqlSink


@pytest.mark.parametrize("build", [SqlSink, ResponseStore, SqlResponseProvider])
def test_a_postgresql_url_without_asyncpg_names_the_extra(
    build: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'eventguard\[postgres\]'"):
        build("postgresql://app@db.example/prod")
