"""A spool path that names something else (the database itself, a config file, a directory) is
refused where it is given, and the file is left exactly as it was.

Before, ``SqlSink(spool_path="config.ini")`` and ``start()`` removed ``config.ini``: the sink's replay
set the file aside, read each line as a bad entry, kept them in the quarantine and unlinked the file.
``eventguard spool replay --spool app.db`` removed the database itself (tab completion gives
``eventguard.db`` as readily as ``eventguard.db.spool.jsonl``); a directory was renamed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eventguard import BadSpoolPath, ResponseStore
from eventguard.cli import app
from eventguard.sink import SqlSink
from eventguard.sink.spool import Spool

from .helpers import run_guarded, script

STEP = 60.0


def _files(root: Path) -> dict[str, bytes | None]:
    """Every file and directory under ``root`` (a directory as None), with its content."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _database(tmp_path: Path) -> Path:
    db = tmp_path / "app.db"

    async def fill() -> None:
        async with asyncio.timeout(STEP):
            async with SqlSink(f"sqlite:///{db}", spool_path=tmp_path / "spool.jsonl") as sink:
                await run_guarded(sink, script("resp_kept"))

    asyncio.run(fill())
    return db


@pytest.mark.parametrize(
    "other",
    [
        "the database",
        "a config file",
        "a binary file",
        "a directory",
        "a line of text",
        # Each starts as the loose check of a spool did ('{' or 'EG'): each was replayed and deleted.
        "a JSON config",
        "a one-line JSON file",
        "a JSON-lines log",
        "text that starts with EG",
    ],
)
def test_a_path_that_is_not_a_spool_is_refused_and_left_as_it_was(other: str, tmp_path: Path) -> None:
    db = _database(tmp_path)
    path = {
        "the database": db,
        "a config file": tmp_path / "config.ini",
        "a binary file": tmp_path / "blob.bin",
        "a directory": tmp_path / "spooldir",
        "a line of text": tmp_path / "notes.txt",
        "a JSON config": tmp_path / "settings.json",
        "a one-line JSON file": tmp_path / "package.json",
        "a JSON-lines log": tmp_path / "app.log.jsonl",
        "text that starts with EG": tmp_path / "recipes.txt",
    }[other]
    written = {
        "a JSON config": b'{\n  "server": {"port": 8080},\n  "debug": true\n}\n',
        "a one-line JSON file": b'{"name": "my-app", "version": "1.0.0"}\n',
        "a JSON-lines log": b'{"level":"info","msg":"started"}\n{"level":"warn","msg":"slow"}\n',
        "text that starts with EG": b"EGG recipes\nTwo eggs, flour.\n",
    }
    if other in written:
        path.write_bytes(written[other])
    if other == "a config file":
        path.write_text("[server]\nport = 8080\n")
    elif other == "a binary file":
        path.write_bytes(bytes(range(256)) * 4)
    elif other == "a directory":
        path.mkdir()
        (path / "inside.txt").write_text("mine")
    elif other == "a line of text":
        path.write_text("\n\nEverything here is mine.\n")
    before = _files(tmp_path)
    with pytest.raises(BadSpoolPath, match=r"^spool_path .* is not a spool file: it "):
        SqlSink(f"sqlite:///{db}", spool_path=path)
    with pytest.raises(BadSpoolPath, match=r"is not a spool file"):
        Spool(path)
    argv = ["spool", "replay", "--database-url", f"sqlite:///{db}", "--spool", str(path)]
    result = CliRunner().invoke(app, argv)
    said = "is a directory" if other == "a directory" else "is not a spool file"  # typer checks a dir
    assert result.exit_code != 0 and said in result.output, result.output
    assert _files(tmp_path) == before

    async def read() -> str | None:
        async with asyncio.timeout(STEP), ResponseStore(f"sqlite:///{db}") as store:
            row = await store.get("resp_kept")
        return None if row is None else row.status

    assert asyncio.run(read()) == "completed"


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_the_databases_own_files_are_refused_by_name_even_empty_or_absent(
    suffix: str, tmp_path: Path
) -> None:
    """A ``-wal`` is empty after a checkpoint, and an empty file looks like a spool: the sink knows
    its database's files by name, through a symlink too."""
    db = tmp_path / "app.db"
    for path in (db.with_name(db.name + suffix), tmp_path / "link"):
        if path.name == "link":
            path.symlink_to(db.with_name(db.name + suffix))
        with pytest.raises(BadSpoolPath, match=r"is not a spool file: it is the database's own file$"):
            SqlSink(f"sqlite:///{db}", spool_path=path)
        path.parent.joinpath(db.name + suffix).write_bytes(b"")
    assert (tmp_path / (db.name + suffix)).read_bytes() == b""


@pytest.mark.parametrize(
    "content",
    [b"", b"\n", b"\n\n\n", b"\nEG1 ", b"\nE", b"\nEG", b"\nEG1", b"\nEG1 27", b"\n{", b'\n{"response_id"'],
)
def test_an_empty_or_torn_spool_is_still_a_spool(content: bytes, tmp_path: Path) -> None:
    """What a spool can look like after a crash at any byte of its first append: still taken."""
    path = tmp_path / "spool.jsonl"
    path.write_bytes(content)
    assert Spool(path).path == path


def test_a_spool_the_sink_wrote_is_taken_and_replayed(tmp_path: Path) -> None:
    """The check refuses nothing a sink writes: a real spool (the database away at first) replays."""
    db = tmp_path / "later.db"
    spool = tmp_path / "spool.jsonl"

    async def main() -> int:
        async with asyncio.timeout(STEP):
            away = SqlSink("postgresql://u@127.0.0.1:9/away", spool_path=spool, connect_timeout=1)
            await run_guarded(away, script("resp_spooled"))
            await away.aclose()
            assert Spool(spool).pending()
            sink = SqlSink(f"sqlite:///{db}", spool_path=spool)
            await sink.start()
            replayed = await sink.replay_spool()
            await sink.aclose()
            return replayed.events

    assert asyncio.run(main()) == len(script("resp_spooled"))


def test_a_spool_named_by_a_symlink_is_replayed_where_the_link_points_and_the_link_stays(
    tmp_path: Path,
) -> None:
    """A spool on a mounted volume, named by a link: the replay set the link aside (renamed it) and
    deleted it, left the replayed entries in the target, and the next append made a new file where
    the link had been, off the volume."""
    db = tmp_path / "later.db"
    volume = tmp_path / "volume"
    volume.mkdir()
    target = volume / "spool.jsonl"
    link = tmp_path / "spool.jsonl"
    link.symlink_to(target)

    async def spool_one(rid: str) -> None:
        away = SqlSink("postgresql://u@127.0.0.1:9/away", spool_path=link, connect_timeout=1)
        await run_guarded(away, script(rid))
        await away.aclose()

    async def main() -> int:
        async with asyncio.timeout(STEP):
            await spool_one("resp_linked_1")
            assert target.stat().st_size > 0 and link.is_symlink()
            sink = SqlSink(f"sqlite:///{db}", spool_path=link)
            await sink.start()
            replayed = await sink.replay_spool()
            await sink.aclose()
            assert link.is_symlink() and not target.exists()  # replayed and emptied, the link kept
            await spool_one("resp_linked_2")
            return replayed.events

    assert asyncio.run(main()) == len(script("resp_linked_1"))
    assert link.is_symlink() and Spool(link).pending()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["later.db", "spool.jsonl", "volume", *(p.name for p in tmp_path.glob("later.db-*"))]
    )


def test_replay_names_the_default_spool_when_no_spool_was_given(tmp_path: Path) -> None:
    """Without ``--spool`` the spool is the default beside the SQLite file: the error must not blame
    an option the user never gave (it said ``--spool: ...``)."""
    db = _database(tmp_path)
    default = tmp_path / "app.db.spool.jsonl"
    default.write_text("[server]\nport = 8080\n")
    before = _files(tmp_path)
    result = CliRunner().invoke(app, ["spool", "replay", "--database-url", f"sqlite:///{db}"])
    assert result.exit_code != 0
    assert "the default spool: spool_path" in result.output and "--spool" not in result.output, result.output
    assert _files(tmp_path) == before


def test_a_path_with_a_nul_is_refused_naming_spool_path(tmp_path: Path) -> None:
    """A NUL in the path was os.stat's bare ``ValueError: embedded null byte``, naming no argument."""
    with pytest.raises(BadSpoolPath, match=r"spool_path .* cannot be a file \(a path has no NUL"):
        SqlSink(f"sqlite:///{tmp_path / 'x.db'}", spool_path=tmp_path / "spool\0.jsonl")
