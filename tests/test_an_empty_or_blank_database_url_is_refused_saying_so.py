"""An empty or blank database URL is a :class:`~eventguard.errors.BadDatabaseURL` (a ``ValueError``)
that says so, where it is given: by every constructor that takes a URL, by
``EVENTGUARD_DATABASE_URL`` set to spaces, and by the CLI's ``--database-url``.

Unchecked, ``SqlSink("")`` raised SQLAlchemy's own ``ArgumentError`` ("not a database URL"), which
is no ``ValueError`` and does not say what is wrong. ``None`` (the default) still means
``EVENTGUARD_DATABASE_URL``, else ``./eventguard.db``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eventguard import ResponseStore, SqlResponseProvider, SqlSink
from eventguard.agent_sessions import SqlAgentSessionStoreProvider
from eventguard.cli import app
from eventguard.errors import BadDatabaseURL

#: (value, what the error says is wrong)
BLANK: list[tuple[str, str]] = [("", "it is empty"), (" ", "it is blank"), ("     ", "it is blank")]
BLANK_IDS = ["empty", "one-space", "spaces"]

MAKERS: dict[str, Callable[[str, Path], object]] = {
    "SqlResponseProvider": lambda url, _tmp: SqlResponseProvider(url),
    "ResponseStore": lambda url, _tmp: ResponseStore(url),
    "SqlSink": lambda url, tmp: SqlSink(url, spool_path=tmp / "spool.jsonl"),
    "SqlAgentSessionStoreProvider": lambda url, _tmp: SqlAgentSessionStoreProvider(url),
}


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user's EVENTGUARD_DATABASE_URL, and no ./eventguard.db left anywhere but tmp_path."""
    monkeypatch.delenv("EVENTGUARD_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize(("value", "problem"), BLANK, ids=BLANK_IDS)
def test_an_empty_or_blank_url_is_a_bad_database_url(
    maker: str, value: str, problem: str, tmp_path: Path
) -> None:
    with pytest.raises(BadDatabaseURL) as raised:
        MAKERS[maker](value, tmp_path)
    assert isinstance(raised.value, ValueError)
    assert raised.value.problem.startswith(problem), raised.value.problem
    assert raised.value.shown == value, "an empty or blank URL holds no secret: shown as it is"
    assert not list(tmp_path.iterdir()), "nothing is created for a refused URL"


@pytest.mark.parametrize("maker", sorted(MAKERS))
def test_an_environment_url_of_spaces_is_a_bad_database_url(
    maker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENTGUARD_DATABASE_URL", "   ")
    with pytest.raises(BadDatabaseURL, match="it is blank"):
        MAKERS[maker](None, tmp_path)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("value", "problem"), BLANK, ids=BLANK_IDS)
def test_the_cli_says_an_empty_or_blank_url_is_so(value: str, problem: str) -> None:
    result = CliRunner().invoke(app, ["responses", "list", "--database-url", value], catch_exceptions=False)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"eventguard: error: bad database URL {value!r}: {problem}"), lines[0]
