"""An SQLite URI filename, as SQLAlchemy documents it (``sqlite:///file:/data/app.db?mode=rwc&uri=true``),
names the file in its path. Taken literally, ``file:/data/app.db`` made an empty directory tree named
``file:`` in the working directory (the engine's parent-directory step), ``verify`` and ``spool replay``
said "no database at file:/data/app.db", and the default spool went beside that phantom path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from eventguard import ResponseStore, SqlSink, guard
from eventguard.cli import app
from eventguard.sql.engine import sqlite_path

from .conftest import STEP, script


async def _stream(rid: str) -> AsyncIterator[dict[str, Any]]:
    for event in script(rid, "completed"):
        yield event


def test_a_uri_filename_is_the_file_in_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    db = tmp_path / "data" / "app.db"
    db.parent.mkdir()
    url = f"sqlite:///file:{db}?mode=rwc&uri=true"
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade", "--database-url", url]).exit_code == 0
    sink = SqlSink(url)
    assert sink.spool.path == Path(f"{db}.spool.jsonl")

    async def record() -> str | None:
        async with (
            asyncio.timeout(STEP),
            sink,
            guard(_stream("resp_uri"), asyncio.Event(), sink=sink) as g,
        ):
            async for _ in g:
                pass
        async with ResponseStore(url) as store:
            row = await store.get("resp_uri")
        return None if row is None else row.status

    assert asyncio.run(record()) == "completed"
    verified = runner.invoke(app, ["verify", "--database-url", url])
    assert verified.exit_code == 0 and "checked 1 response" in verified.output, verified.output
    replayed = runner.invoke(app, ["spool", "replay", "--database-url", url])
    assert replayed.exit_code == 0, replayed.output
    assert sorted(p.name for p in db.parent.iterdir() if not p.name.startswith("app.db-")) == ["app.db"]
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("spelling", ["yes", "on", "1", "True", "t"])
def test_every_spelling_the_driver_takes_for_uri_names_the_file_in_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    # The driver reads `uri` with SQLAlchemy's asbool; only "true" and "1" were read so before.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    db = tmp_path / "app.db"
    url = f"sqlite:///file:{db}?mode=rwc&uri={spelling}"
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert db.is_file()
    assert SqlSink(url).spool.path == Path(f"{db}.spool.jsonl")
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("memory", ["mode=memory", "vfs=memdb"])
def test_an_in_memory_uri_filename_names_no_file(memory: str) -> None:
    assert sqlite_path(make_url(f"sqlite:///file:/shared.db?{memory}&uri=on")) is None
