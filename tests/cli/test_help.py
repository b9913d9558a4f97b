"""Every subcommand answers --help."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from eventguard.cli import app

COMMANDS = [
    [],
    ["demo"],
    ["db"],
    ["db", "upgrade"],
    ["db", "downgrade"],
    ["db", "current"],
    ["db", "stamp"],
    ["db", "history"],
    ["responses"],
    ["responses", "list"],
    ["responses", "show"],
    ["sessions"],
    ["stats"],
    ["verify"],
    ["spool"],
    ["spool", "replay"],
    ["prune"],
    ["recover"],
]


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "eventguard")
def test_help(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    if path and path[-1] not in ("db", "responses", "spool"):
        assert "--json" in result.output
    if path and path[-1] not in ("db", "responses", "spool", "history"):  # history reads no database
        assert "--database-url" in result.output
    if path and path[-1] not in ("db", "responses", "spool", "history", "demo"):
        assert "--schema" in result.output  # every command that reads or writes eventguard's tables


def test_no_arguments_shows_help() -> None:
    result = CliRunner().invoke(app, [])
    assert "Usage" in result.output
    # click >= 8.2 raises a bare group's help as a usage error: it must not be escaped into one line
    assert "\\n" not in result.output and len(result.output.splitlines()) > 10, result.output
    for name in ("demo", "db", "responses", "sessions", "stats", "verify", "spool", "prune", "recover"):
        assert name in result.output


def test_console_script_entry_point() -> None:
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "eventguard"]
    assert ep.value == "eventguard.cli:main"
    assert callable(ep.load())
