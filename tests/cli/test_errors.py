"""One-line errors, no traceback, and never a password."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eventguard.cli import app

from .conftest import Cli


def one_line(result: object) -> str:
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert result.exit_code == 2, stderr  # type: ignore[attr-defined]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("eventguard: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://root:hunter2@db.example/app", "unsupported database 'mysql'"),
        ("this is not a url", "not a database URL"),
        # a file's path: not shown (it could be a secret pasted in the wrong place), but said to be one
        ("/var/lib/app/history.db", "it has no scheme:// (a SQLite file is sqlite:///relative/path.db"),
        ("postgresql://root:hunter2@[broken/app", "cannot use the database postgresql+asyncpg://root:***@"),
    ],
)
def test_bad_url(url: str, expected: str) -> None:
    line = one_line(Cli(url)("responses", "list"))
    assert expected in line
    assert "hunter2" not in line


def test_unreachable_postgres_hides_the_password() -> None:
    # Port 9 (discard) on loopback: nothing listens; the connection is refused at once.
    cli = Cli("postgresql://eventguard:s3cr3t-pw@127.0.0.1:9/eventguard")
    for args in (["responses", "list"], ["db", "upgrade"], ["stats", "--json"], ["verify"]):
        result = cli(*args)
        line = one_line(result)
        assert "s3cr3t-pw" not in result.output
        assert "cannot use the database postgresql+asyncpg://eventguard:***@127.0.0.1:9/eventguard" in line


def test_unmigrated_database(cli: Cli, tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "cli.db").close()  # an empty file: no schema
    for args in (
        ["responses", "list"],
        ["responses", "show", "x"],
        ["stats"],
        ["verify"],
        ["prune", "--older-than", "1d"],
        ["recover", "--older-than", "1d"],
        ["spool", "replay"],
    ):
        line = one_line(cli(*args))
        assert "no eventguard schema" in line and "eventguard db upgrade" in line


def test_missing_database_file(cli: Cli, tmp_path: Path) -> None:
    line = one_line(cli("responses", "list"))
    assert "no database at" in line
    assert not (tmp_path / "cli.db").exists()


def test_unknown_response_id(filled: str) -> None:
    line = one_line(Cli(filled)("responses", "show", "resp_nope"))
    assert line == "eventguard: error: unknown response id 'resp_nope'"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["responses", "list", "--status", "done"], "unknown status 'done'"),
        (["responses", "list", "--since", "yesterday"], "--since: expected an age"),
        (["prune", "--older-than", "soon"], "--older-than: expected a duration"),
        (["recover", "--older-than", "1h", "--policy", "delete"], "--policy must be interrupted or failed"),
    ],
)
def test_bad_arguments(filled: str, args: list[str], expected: str) -> None:
    assert expected in one_line(Cli(filled)(*args))


@pytest.mark.parametrize(
    ("argv", "says", "where"),
    [
        (["stats", "--bogus"], "--bogus", "eventguard stats"),
        (["responses", "show"], "response_id", "eventguard responses show"),
        (["nosuch"], "nosuch", "eventguard"),
        (["prune"], "--older-than", "eventguard prune"),
    ],
)
def test_a_usage_error_is_one_line_with_where_to_find_help(argv: list[str], says: str, where: str) -> None:
    """Issue 14: click's usage errors were three lines (usage, a hint, the error). click's own
    wording differs between releases ('No such option: --bogus', "no such option '--bogus'")."""
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("eventguard: error: ") and line.endswith(f"(see `{where} --help`)"), line
    assert says in line.lower(), line
    assert result.stdout == ""


def test_a_postgresql_url_without_its_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if the postgres extra were not installed
    line = one_line(Cli("postgresql://u:hunter2@db.example/app")("stats"))
    said = "PostgreSQL needs asyncpg, which is not installed: pip install 'eventguard[postgres]'"
    assert line == f"eventguard: error: {said}"


def test_printing_a_migrations_sql_needs_no_postgresql_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # a DBA's machine without the postgres extra
    result = Cli("postgresql://u:hunter2@db.example/app")("db", "upgrade", "--sql")
    assert result.exit_code == 0, result.output
    assert "CREATE TABLE eventguard_responses" in result.output
