"""``eventguard db upgrade | downgrade | current``."""

from __future__ import annotations

import json
from pathlib import Path

from eventguard.sql.migrate import expected_heads

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
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("EVENTGUARD_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    result = cli("db", "upgrade", url=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "env.db").exists()
