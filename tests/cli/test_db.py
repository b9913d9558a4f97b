"""``eventguard db upgrade | downgrade | stamp | current | history``, and ``--schema`` everywhere."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from eventguard.sql.migrate import expected_heads, history, upgrade_sql

from .conftest import Cli


def test_upgrade_current_downgrade(cli: Cli, tmp_path: Path) -> None:
    head = expected_heads()[0]
    up = cli("db", "upgrade")
    assert up.exit_code == 0, up.output
    assert f"upgraded (none) -> {head}" in up.stdout
    assert (tmp_path / "cli.db").exists()

    again = cli("db", "upgrade")
    assert again.exit_code == 0 and f"already at {head}" in again.stdout

    current = cli("db", "current", "--json")
    assert current.exit_code == 0, current.output
    assert json.loads(current.stdout) == {
        "database_url": cli.url.replace("sqlite:", "sqlite+aiosqlite:"),
        "current": [head],
        "head": [head],
        "up_to_date": True,
    }
    human = cli("db", "current")
    assert "up to date" in human.stdout

    down = cli("db", "downgrade", "base", "--json")
    assert down.exit_code == 0, down.output
    assert json.loads(down.stdout)["after"] == []
    assert "not migrated" in cli("db", "current").stdout


def test_downgrade_needs_a_revision(cli: Cli) -> None:
    result = cli("db", "downgrade")
    assert result.exit_code == 2
    assert "Missing argument" in result.output and "REVISION" in result.output


def test_current_of_a_missing_file_does_not_create_it(cli: Cli, tmp_path: Path) -> None:
    result = cli("db", "current")
    assert result.exit_code == 2
    assert "no database at" in result.stderr and "eventguard db upgrade" in result.stderr
    assert not (tmp_path / "cli.db").exists()


def test_default_url_is_the_sinks_file_in_the_working_directory(cli: Cli, tmp_path: Path) -> None:
    result = cli("db", "upgrade", url=False)
    assert result.exit_code == 0, result.output
    assert "sqlite+aiosqlite:///eventguard.db" in result.stdout
    assert (tmp_path / "eventguard.db").exists()


def test_environment_variable(cli: Cli, tmp_path: Path, monkeypatch: object) -> None:
    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("EVENTGUARD_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    result = cli("db", "upgrade", url=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "env.db").exists()


def test_downgrade_minus_one_steps_back_one_revision(cli: Cli) -> None:
    """``db downgrade -1`` (offered by the help) was ``No such option: -1`` (issue 14)."""
    assert cli("db", "upgrade").exit_code == 0
    down = cli("db", "downgrade", "-1", "--json")
    assert down.exit_code == 0, down.output
    heads = [r.revision for r in history()]
    assert json.loads(down.stdout)["before"] == [heads[0]]
    assert json.loads(down.stdout)["after"] == [heads[1]]


def test_downgrade_with_an_unknown_option_is_one_line(cli: Cli) -> None:
    assert cli("db", "upgrade").exit_code == 0
    result = cli("db", "downgrade", "--bogus")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "eventguard: error: no such option: --bogus (a relative REVISION is -N, such as -1)"
    ]


def test_stamp_records_a_revision_without_running_a_migration(cli: Cli) -> None:
    heads = [r.revision for r in history()]
    assert cli("db", "upgrade", heads[1]).exit_code == 0
    before = _tables()
    stamped = cli("db", "stamp", "--json")
    assert stamped.exit_code == 0, stamped.output
    assert json.loads(stamped.stdout)["after"] == [heads[0]]
    assert _tables() == before  # stamped, not migrated: nothing the newest migration makes is there


def _tables() -> set[str]:
    with sqlite3.connect(Path("cli.db")) as conn:
        return {row[0] for row in conn.execute("select name from sqlite_master where type = 'table'")}


def test_history_lists_the_shipped_migrations_newest_first_without_a_database(cli: Cli) -> None:
    result = cli("db", "history", "--json", url=False)
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [r["revision"] for r in listed] == [r.revision for r in history()]
    assert listed[0]["is_head"] and listed[0]["revision"] == expected_heads()[0]
    assert listed[-1]["down_revision"] is None
    assert not Path("eventguard.db").exists()


def test_upgrade_sql_prints_the_ddl_and_touches_no_database(cli: Cli, tmp_path: Path) -> None:
    result = cli("db", "upgrade", "--sql")
    assert result.exit_code == 0, result.output
    assert "CREATE TABLE eventguard_responses" in result.stdout
    assert "eventguard_alembic_version" in result.stdout and result.stdout.rstrip().endswith("COMMIT;")
    assert not (tmp_path / "cli.db").exists()
    head = expected_heads()[0]
    step = cli("db", "upgrade", "--sql", "--from", history()[1].revision)
    assert step.exit_code == 0, step.output
    assert "CREATE TABLE eventguard_responses" not in step.stdout and f"'{head}'" in step.stdout


def test_upgrade_sql_for_a_postgresql_schema_sets_its_search_path_and_never_prints_the_password() -> None:
    url = "postgresql+asyncpg://app:s3cr3t@db.invalid:5432/agents"
    result = Cli(url)("db", "upgrade", "--sql", "--schema", 'eg "x"')
    assert result.exit_code == 0, result.output
    assert 'SET search_path TO "eg ""x""";' in result.stdout
    assert "BIGSERIAL" in result.stdout  # the PostgreSQL dialect's DDL
    assert "s3cr3t" not in result.output


@pytest.mark.parametrize(("start", "revision"), [("head", "base"), ("0005", "0003")])
def test_upgrade_sql_from_a_revision_after_the_target_is_refused_not_an_empty_script(
    cli: Cli, tmp_path: Path, start: str, revision: str
) -> None:
    """Alembic printed ``BEGIN; COMMIT;`` for it: a DBA would run it and think the schema upgraded."""
    result = cli("db", "upgrade", "--sql", "--from", start, revision)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and f"--from {start}: is not before" in result.stderr
    with pytest.raises(ValueError, match=rf"^start '{start}': is not before '{revision}'"):
        upgrade_sql("sqlite:///unused.db", revision, start=start)
    assert not (tmp_path / "cli.db").exists()


def test_from_without_sql_is_a_one_line_error(cli: Cli) -> None:
    result = cli("db", "upgrade", "--from", "0001")
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1 and "--from goes with --sql" in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["db", "upgrade"],
        ["db", "current"],
        ["responses", "list"],
        ["sessions"],
        ["stats"],
        ["verify"],
        ["spool", "replay"],
        ["prune", "--older-than", "1d"],
    ],
)
def test_schema_on_sqlite_is_a_one_line_error(cli: Cli, command: list[str], tmp_path: Path) -> None:
    result = cli(*command, "--schema", "eg")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "eventguard: error: --schema 'eg' is a PostgreSQL setting: an SQLite database has one schema"
    ]
    assert not (tmp_path / "cli.db").exists()
