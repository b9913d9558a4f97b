"""``verify``, ``spool replay``, ``prune`` and ``recover`` show a ``rich.progress`` bar on a terminal,
and stay quiet with ``--json`` or when piped (issue 14, part 5)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from eventguard.cli import _common

from .conftest import Cli

LONG_COMMANDS = {
    "verify": (["verify"], "verifying stored histories"),
    "spool replay": (["spool", "replay"], "replaying the spool"),
    "prune": (["prune", "--older-than", "7d"], "pruning history older than 7d"),
    "recover": (["recover", "--older-than", "1h"], "recovering responses stuck for more than 1h"),
}


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stderr as a terminal: what the bar draws lands here."""
    screen = io.StringIO()
    monkeypatch.setattr(_common, "err", Console(file=screen, force_terminal=True, width=120))
    return screen


@pytest.mark.parametrize("name", LONG_COMMANDS)
def test_a_long_command_draws_a_progress_bar_on_a_terminal(
    filled: str, terminal: io.StringIO, name: str
) -> None:
    argv, description = LONG_COMMANDS[name]
    result = Cli(filled)(*argv)
    assert result.exit_code == 0, result.output
    assert description in terminal.getvalue()
    assert description not in result.stdout  # the bar is on stderr, and gone when the result prints


@pytest.mark.parametrize("name", LONG_COMMANDS)
def test_with_json_a_long_command_draws_nothing_even_on_a_terminal(
    filled: str, terminal: io.StringIO, name: str
) -> None:
    argv, _ = LONG_COMMANDS[name]
    result = Cli(filled)(*argv, "--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert terminal.getvalue() == ""


@pytest.mark.parametrize("name", LONG_COMMANDS)
def test_piped_a_long_command_draws_nothing(filled: str, name: str) -> None:
    argv, description = LONG_COMMANDS[name]
    result = Cli(filled)(*argv)
    assert result.exit_code == 0, result.output
    assert description not in result.stderr and "\x1b" not in result.stderr
