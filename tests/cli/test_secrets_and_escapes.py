"""Issue 11, passwords and terminals.

1. No secret of a database URL is ever printed, whatever shape the URL has (a password in the
   userinfo or in the query, a password with an unencoded ``@``, a URL that does not parse, one
   with a NUL or a newline): not by any command, through ``--database-url`` or
   ``EVENTGUARD_DATABASE_URL``, not in usage errors, reprs or logs; and the error stays one line
   that says what is wrong.
2. No stored string reaches the terminal raw: controls, escape sequences, bidi overrides and rich
   markup are shown escaped by every printer, in tables and in plain lines, and ``--json`` stays
   valid JSON that gives the stored strings back exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import insert, text, update
from sqlalchemy.exc import ArgumentError
from typer.testing import CliRunner

from eventguard import BadDatabaseURL, ResponseInfo, ResponseStore, SqlResponseProvider, guard
from eventguard.cli import _common, app
from eventguard.sink import SqlSink
from eventguard.sql import engine as _db
from eventguard.sql.tables import VERSION_TABLE, events, responses, transitions

from .conftest import STEP, Cli, record

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def secret() -> str:
    """A password no output could contain by chance."""
    return f"Sx{uuid.uuid4().hex[:12]}Qz"


# Each builds a URL around a unique secret; that secret must never be printed.
URLS: dict[str, Callable[[str], str]] = {
    "userinfo": lambda s: f"postgresql://u:{s}@127.0.0.1:9/db",
    "query-password": lambda s: f"postgresql+asyncpg://u@127.0.0.1:9/db?password={s}",
    "query-sslpassword": lambda s: f"postgresql://u@127.0.0.1:9/db?application_name=eg&sslpassword={s}",
    "query-token-and-key": lambda s: f"postgresql://u@127.0.0.1:9/db?Auth_Token={s}&API-KEY={s}",
    "query-pwd-and-user": lambda s: f"postgresql://127.0.0.1:9/db?user=u&pwd={s}",
    "unencoded-at": lambda s: f"postgresql+asyncpg://u:p@{s}@127.0.0.1:9/db",
    "unencoded-at-slash": lambda s: f"postgresql://u:p@ss/{s}@127.0.0.1:9/db",
    "unencoded-at-colon": lambda s: f"postgresql://u:p@ss:{s}@127.0.0.1:9/db",
    "bad-port": lambda s: f"postgresql+asyncpg://u:{s}@h:notaport/db",
    "no-scheme": lambda s: f"://u:{s}@",
    "newline": lambda s: f"postgresql://u:{s}@127.0.0.1:9/db\n",
    "tab-and-bidi": lambda s: f"postgresql://u:{s}\t\u202e@127.0.0.1:9/db",
    "percent-encoded": lambda s: f"postgresql://u:{s}%2F%40%3A@127.0.0.1:9/db",
    "space": lambda s: f"postgresql://u:{s} x@127.0.0.1:9/db",
    "sqlite-query": lambda s: f"sqlite:///missing/x.db?password={s}",
    "unsupported": lambda s: f"mysql://root:{s}@db.example/app",
    "not-a-url": lambda s: s,
    "nul": lambda s: f"postgresql://u:{s}\x00@127.0.0.1:9/db",
}
NO_ENV = {"nul"}  # an environment variable cannot hold a NUL
#: The parser cannot read these at all, or reads them as nobody meant (a control character kept
#: in a name, part of the password taken for the host): SqlSink, ResponseStore and
#: SqlResponseProvider refuse them, as the CLI does.
UNPARSEABLE = {
    "bad-port",
    "no-scheme",
    "unsupported",
    "not-a-url",
    "unencoded-at-colon",
    "unencoded-at",
    "unencoded-at-slash",
    "newline",
    "nul",
    "tab-and-bidi",
}

COMMANDS = [
    ["responses", "list"],
    ["responses", "list", "--json"],
    ["responses", "show", "resp_x"],
    ["sessions", "--json"],
    ["stats"],
    ["verify", "--json"],
    ["prune", "--older-than", "1d"],
    ["recover", "--older-than", "1d"],
    ["db", "upgrade"],
    ["db", "downgrade", "base"],
    ["db", "current", "--json"],
    ["spool", "replay", "--spool", "spool.jsonl"],
    ["demo"],
]
USEFUL = (
    "bad database URL",
    "cannot use the database",
    "no database at",
    "unsupported database",
    "no eventguard schema",
)


@pytest.fixture(autouse=True)
def all_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.fixture(autouse=True)
def no_secret_in_warnings() -> Iterator[None]:
    """Warnings (SQLAlchemy's about an ignored ``?password=``, say) name parameters, never values."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    for w in seen:
        assert not re.search(r"Sx[0-9a-f]{12}Qz", str(w.message)), w


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as wide as they want: a cell is never folded in the middle of what a test looks for."""
    monkeypatch.setattr(_common.out, "width", 1000)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, args, env=env, catch_exceptions=False)


def hidden(result: Any, caplog: pytest.LogCaptureFixture, *secrets: str) -> str:
    """Assert no secret in stdout, stderr or the logs; return everything that was shown."""
    shown = f"{result.stdout}\n{result.stderr}\n{caplog.text}"
    for s in secrets:
        assert s not in shown, shown
    return shown


def error_line(result: Any) -> str:
    """The command failed with exactly one error line (the demo may print progress before it)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("eventguard: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


# -- 1. secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(URLS))
def test_no_command_prints_a_secret(case: str, caplog: pytest.LogCaptureFixture) -> None:
    s = secret()
    url = URLS[case](s)
    for args in COMMANDS:
        if args == ["demo"] and url.startswith("sqlite"):
            continue  # it would run the whole demo on the (valid) SQLite URL
        paths = [("option", [*args, "--database-url", url], None)]
        if case not in NO_ENV:
            paths.append(("env", args, {_db.ENV_URL: url}))
        for _how, argv, env in paths:
            caplog.clear()
            result = invoke(argv, env)
            hidden(result, caplog, s)
            if result.exit_code == 0 and case == "sqlite-query":
                continue  # a valid SQLite URL: `db upgrade` created the file, the rest then work
            line = error_line(result)
            assert any(text in line for text in USEFUL), line
            assert line.isprintable(), line


def test_the_errors_say_what_is_wrong() -> None:
    s = secret()
    expected = {
        "unencoded-at": "bad database URL 'postgresql+asyncpg://u:***@127.0.0.1:9/db': "
        "the password holds an unencoded '@' (percent-encode it: %40)",
        "bad-port": "bad database URL 'postgresql+asyncpg://***': its port is not a number",
        "no-scheme": "bad database URL '***': not a database URL",
        "newline": "bad database URL 'postgresql://***': it contains a control or invisible character (\\n)",
        "nul": "bad database URL 'postgresql://***': it contains a control or invisible character (\\x00)",
        "not-a-url": "bad database URL '***': not a database URL",
        "unsupported": "bad database URL 'mysql://root:***@db.example/app': unsupported database 'mysql'",
        "query-password": "cannot use the database postgresql+asyncpg://u@127.0.0.1:9/db?password=***: "
        "ConnectionRefusedError",
        "query-sslpassword": "cannot use the database "
        "postgresql+asyncpg://u@127.0.0.1:9/db?application_name=eg&sslpassword=***: TypeError: "
        "connect() got an unexpected keyword argument",
        "sqlite-query": "no database at missing/x.db (sqlite+aiosqlite:///missing/x.db?password=***)",
    }
    for case, says in expected.items():
        line = error_line(invoke(["responses", "list", "--database-url", URLS[case](s)]))
        assert says in line, (case, line)


def test_usage_errors_hide_the_secret(caplog: pytest.LogCaptureFixture, filled: str) -> None:
    for case, build in sorted(URLS.items()):
        if case in ("not-a-url", "nul"):
            continue  # not a URL: nothing says it is secret / a NUL cannot be in argv
        s = secret()
        url = build(s)
        for args in (
            ["responses", "list", url],  # the URL as an extra argument
            [url],  # ... as the command
            ["responses", "list", "--limit", url],
            ["stats", "--since", url, "--database-url", filled],
            ["responses", "show", url, "--database-url", filled],  # ... as the response id
            ["prune", "--older-than", url, "--database-url", filled],
            ["responses", "list", "--status", url, "--database-url", filled],
        ):
            caplog.clear()
            result = invoke(args)
            assert result.exit_code == 2, (case, args, result.output)
            hidden(result, caplog, s)
    caplog.clear()
    s = secret()
    result = invoke(["responses", "list", "--bogus"], env={_db.ENV_URL: URLS["userinfo"](s)})
    assert result.exit_code == 2 and "No such option" in result.output
    hidden(result, caplog, s)
    for args in (["responses", "list", "--help"], ["db", "--help"], ["--help"], []):
        result = invoke(args, env={_db.ENV_URL: URLS["userinfo"](s)})
        assert "Usage:" in result.output
        hidden(result, caplog, s)


@pytest.mark.parametrize("case", sorted(set(URLS) - UNPARSEABLE))
def test_reprs_hide_the_secret(case: str, tmp_path: Path) -> None:
    s = secret()
    url = URLS[case](s)
    sink = SqlSink(url, spool_path=tmp_path / "spool.jsonl")
    store = ResponseStore(url)
    try:
        assert s not in repr(sink) and s not in repr(store)
        assert s not in _db.safe_url(sink.url) and s not in _db.safe_url(url)
        assert repr(store).startswith("ResponseStore('") and "***" in repr(store)
    finally:
        asyncio.run(store.aclose())


def _url_takers(tmp_path: Path) -> list[Callable[[str | None], object]]:
    """Every public class that takes a database URL (None: ``EVENTGUARD_DATABASE_URL``)."""
    return [
        lambda u: SqlSink(u, spool_path=tmp_path / "spool.jsonl"),
        lambda u: ResponseStore(u),
        lambda u: SqlResponseProvider(u),
    ]


@pytest.mark.parametrize("case", sorted(UNPARSEABLE))
def test_refused_urls_are_not_quoted(case: str, tmp_path: Path) -> None:
    s = secret()
    for make in _url_takers(tmp_path):
        with pytest.raises((ValueError, ArgumentError)) as caught:
            make(URLS[case](s))
        assert s not in str(caught.value) and s not in repr(caught.value)


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unencoded-at", "the password holds an unencoded '@' (percent-encode it: %40)"),
        ("unencoded-at-slash", "the password holds an unencoded '@' (percent-encode it: %40)"),
        ("newline", "it contains a control or invisible character (\\n): a stray newline at the end?"),
        ("nul", "it contains a control or invisible character (\\x00)"),
        ("tab-and-bidi", "it contains a control or invisible character (\\t)"),
    ],
)
def test_the_library_refuses_a_url_the_cli_refuses_before_anything_connects(
    case: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A password with an unencoded '@' leaves part of it in the host, where a resolver (and
    asyncio's debug log) would see it, and a sink would spool against a host that cannot exist:
    the library says what is wrong at once, as the CLI does, from the argument and from
    EVENTGUARD_DATABASE_URL alike, as a BadDatabaseURL (a ValueError) whose fields say what the
    message says. Only a newline is taken for a stray one at the end."""
    s = secret()
    url = URLS[case](s)
    monkeypatch.delenv(_db.ENV_URL, raising=False)
    for make in _url_takers(tmp_path):
        with pytest.raises(BadDatabaseURL, match=re.escape(says) + "$") as caught:
            make(url)
        refused = caught.value
        assert isinstance(refused, ValueError) and refused.problem == says
        assert str(refused) == f"bad database URL {refused.shown!r}: {says}"
        assert s not in str(refused) and s not in refused.shown
        if case not in NO_ENV:
            monkeypatch.setenv(_db.ENV_URL, url)
            with pytest.raises(BadDatabaseURL, match=re.escape(says) + "$"):
                make(None)
            monkeypatch.delenv(_db.ENV_URL)
    assert not (tmp_path / "spool.jsonl").exists()


def test_the_cli_checks_a_url_once_and_says_what_the_library_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI has no check of its own beside the library's: resolving a URL checks it once, and
    the error shows BadDatabaseURL's own problem and shown URL, so the two cannot drift apart."""
    s = secret()
    checks: list[str] = []
    real = _db.url_problem

    def counted(raw: str) -> str | None:
        checks.append(raw)
        return real(raw)

    monkeypatch.setattr(_db, "url_problem", counted)
    for case in ("unencoded-at", "newline", "bad-port"):
        with pytest.raises(BadDatabaseURL) as refused:
            _db.resolve_url(URLS[case](s))
        checks.clear()
        with pytest.raises(_common.CliError) as said:
            _common.resolve(URLS[case](s))
        assert len(checks) == 1, (case, len(checks))
        line = str(said.value)
        assert line == f"bad database URL {_common.quoted(refused.value.shown)}: {refused.value.problem}"
        assert s not in line
    checks.clear()
    _common.resolve(URLS["userinfo"](s))  # a good URL passes the same one check
    assert len(checks) == 1, len(checks)


@pytest.mark.parametrize("case", sorted(set(URLS) - UNPARSEABLE - {"sqlite-query"}))
def test_the_sinks_outage_log_hides_the_secret(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sink cannot reach the database: it logs the outage (URL and reason) and spools."""
    s = secret()
    url = URLS[case](s)

    async def main() -> None:
        sink = SqlSink(url, spool_path=tmp_path / "spool.jsonl", connect_timeout=2.0)

        async def stream() -> AsyncIterator[dict[str, Any]]:
            yield {"type": "response.created", "response": {"id": "resp_out", "status": "in_progress"}}
            yield {"type": "response.completed", "response": {"id": "resp_out", "status": "completed"}}

        async with asyncio.timeout(STEP):
            async with guard(stream(), asyncio.Event(), sink=sink, cancel_grace=None) as g:
                async for _ in g:
                    pass
            await sink.aclose()

    asyncio.run(main())
    assert "cannot write to" in caplog.text
    assert s not in caplog.text, caplog.text


#: Parsed, reachable-looking URLs: a driver gets to see them.
DRIVER_SEES = sorted(set(URLS) - UNPARSEABLE - {"sqlite-query"})


@pytest.mark.parametrize("case", DRIVER_SEES)
def test_a_driver_that_echoes_the_dsn(
    case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Drivers may put the DSN, or the password, in their errors and logs: the CLI scrubs both."""
    s = secret()
    url = URLS[case](s)

    async def echoing_driver(resolved: Any, schema: str | None = None) -> None:
        raw = resolved.render_as_string(hide_password=False)
        secret_value = resolved.password or resolved.query.get("password") or s
        logging.getLogger("asyncpg.connect").warning("\x1b[2Jconnecting to %s (%s)", raw, secret_value)
        raise OSError(f"could not connect to {raw!r}: password {secret_value} rejected\nDETAIL: {raw}")

    monkeypatch.setattr(_common, "check_schema", echoing_driver)
    for args in (["responses", "list"], ["stats"], ["verify"], ["prune", "--older-than", "1d"]):
        for argv, env in (([*args, "--database-url", url], None), (args, {_db.ENV_URL: url})):
            caplog.clear()
            result = invoke(argv, env)
            hidden(result, caplog, s)
            line = error_line(result)
            assert "cannot use the database" in line and "OSError: could not connect to" in line, line
            assert "connecting to" in caplog.text and "\x1b" not in caplog.text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+asyncpg://u@h/db?password=SECRET", "postgresql+asyncpg://u@h/db?password=***"),
        ("postgresql+asyncpg://u:p@SECRET@h:5/db", "postgresql+asyncpg://u:***@h:5/db"),
        ("postgresql+asyncpg://u:SECRET@h:notaport/db", "postgresql+asyncpg://***"),
        ("://u:SECRET@", "***"),
        ("postgresql://u:SECRET@h/db\n", "postgresql://***"),
        ("postgresql://u:SE\x00CRET@h/db", "postgresql://***"),
        ("postgresql://u:p@ss/SECRET@h/db", "postgresql://***"),
        ("SECRET", "***"),
        (
            "postgresql://u:SECRET@h/db?sslmode=require&sslpassword=SECRET&access_token=SECRET&x=y",
            "postgresql://u:***@h/db?access_token=***&sslmode=require&sslpassword=***&x=y",
        ),
        (
            "postgresql://h/db?dsn=postgresql://u:SECRET@h2/db",
            "postgresql://h/db?dsn=postgresql://u:***@h2/db",
        ),
        ("postgresql://user@server:SECRET@h.example/db", "postgresql://user%40server:***@h.example/db"),
        ("sqlite+aiosqlite:///tmp/x.db", "sqlite+aiosqlite:///tmp/x.db"),
        ("postgresql+asyncpg://u:***@h:5/db", "postgresql+asyncpg://u:***@h:5/db"),
    ],
)
def test_safe_url(url: str, shown: str) -> None:
    assert _db.safe_url(url) == shown
    try:
        parsed = _db.resolve_url(url)
    except (ValueError, ArgumentError):
        return
    assert "SECRET" not in _db.safe_url(parsed) and "CRET" not in _db.safe_url(parsed)


def test_scrub_removes_every_form_of_the_password() -> None:
    url = "postgresql://u:p%40ss w'rd@h/db?password=t0k%2Fen"
    secrets = _db.url_secrets(url)
    text = (
        "p@ss w'rd | p%40ss w'rd | p%40ss%20w%27rd | p%40ss+w%27rd | p@ss w\\'rd | t0k/en | t0k%2Fen "
        "| postgresql://x:other@h/db?token=abc"
    )
    scrubbed = _db.scrub(text, secrets)
    for leaked in ("p@ss", "ss w", "p%40", "t0k", "other", "abc"):
        assert leaked not in scrubbed, scrubbed
    assert scrubbed.count("***") == 9


# -- 1b. secrets against a real PostgreSQL server ---------------------------------------------------


async def _pg_admin(statement: str) -> None:
    async with asyncio.timeout(30):
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (the CLI has no schema option: it uses the database's public one)."""
    name = f"eg_cli_{uuid.uuid4().hex[:12]}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.skip(f"no PostgreSQL at {PG_ADMIN}: {type(exc).__name__}: {exc}")
    try:
        yield name
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.mark.postgres
def test_postgres_secrets_never_printed(pg_database: str, caplog: pytest.LogCaptureFixture) -> None:
    s = secret()
    # The server trusts local connections, so the password is accepted and ignored: every command
    # runs, and prints the URL, masked.
    for url in (
        f"postgresql://postgres:{s}@127.0.0.1:5432/{pg_database}",
        f"postgresql+asyncpg://postgres@127.0.0.1:5432/{pg_database}?password={s}",
    ):
        for args in (
            ["db", "upgrade"],
            ["db", "current"],
            ["db", "current", "--json"],
            ["responses", "list"],
            ["sessions"],
            ["stats"],
            ["verify"],
            ["prune", "--older-than", "1d"],
            ["recover", "--older-than", "1d"],
            ["spool", "replay", "--spool", "spool.jsonl"],
        ):
            caplog.clear()
            result = invoke([*args, "--database-url", url])
            assert result.exit_code == 0, result.output
            hidden(result, caplog, s)
        assert "***" in invoke(["db", "current", "--database-url", url]).stdout
        caplog.clear()
        result = invoke(["responses", "show", "resp_nope"], env={_db.ENV_URL: url})
        hidden(result, caplog, s)
        assert error_line(result) == "eventguard: error: unknown response id 'resp_nope'"
    # The server's own errors, one line each.
    for url, says in (
        (f"postgresql://postgres:{s}@127.0.0.1:5432/{pg_database}_missing", "does not exist"),
        (f"postgresql://eg_nobody_{uuid.uuid4().hex[:6]}:{s}@127.0.0.1:5432/test", "does not exist"),
        (f"postgresql://postgres@127.0.0.1:5432/{pg_database}?password={s}&ssl=bogus", "sslmode"),
    ):
        caplog.clear()
        result = invoke(["db", "current", "--database-url", url])
        hidden(result, caplog, s)
        assert says in error_line(result)


# -- 2. escapes ------------------------------------------------------------------------------------

#: Stored strings that would drive or fool a terminal, or rich.
ESC = "\x1b[31mRED\x1b[0m\x1b]0;pwned\x07"
FAKE_ROW = "\nresp_fake  completed  normal"
BIDI = "\u202eevil\u202c\u2066x\u2069"
C1 = "\x9b2J\x85"
MARKUP = "[bold red]loud[/bold red] [link=https://evil.example]click[/link] :smile:"
HOSTILE = f"{ESC}{FAKE_ROW}\r\x08\x7f{BIDI}{C1}{MARKUP}"
HOSTILE_SHOWN = (
    "\\x1b[31mRED\\x1b[0m\\x1b]0;pwned\\x07\\nresp_fake  completed  normal\\r\\x08\\x7f"
    "\\u202eevil\\u202c\\u2066x\\u2069\\x9b2J\\x85" + MARKUP
)
RID = "resp_\x1b[2J\u202e\nresp_fake[red]x[/red]"
RID_SHOWN = "resp_\\x1b[2J\\u202e\\nresp_fake[red]x[/red]"


def printable_output(text: str) -> None:
    """Nothing raw: every character printable, newlines only between lines of our own."""
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)
    assert "\nresp_fake" not in text  # no row or line of its own


async def fill_hostile(url: str) -> None:
    """The real guard and sink store a response whose every string is hostile."""
    async with asyncio.timeout(STEP):
        sink = SqlSink(url, spool_path=Path("spool.jsonl"))
        await sink.start()
        try:

            async def stream() -> AsyncIterator[dict[str, Any]]:
                yield {"type": "response.created", "response": {"id": RID, "status": "in_progress"}}
                yield {"type": "response.in_progress", "response": {"id": RID, "status": "in_progress"}}
                yield {"type": "x." + HOSTILE[:100], "delta": "x"}
                yield {
                    "type": "response.failed",
                    "response": {
                        "id": RID,
                        "status": "failed",
                        "error": {"code": "c" + HOSTILE[:100], "message": "boom " + HOSTILE},
                    },
                }
                yield {"type": "late." + HOSTILE[:100]}  # after the terminal: an anomaly

            info = ResponseInfo(
                agent_name="agent" + HOSTILE[:100],
                conversation_id="conv" + HOSTILE[:100],
                chain_id="chain" + HOSTILE[:100],
                partition_key="pk" + HOSTILE[:100],
            )
            async with guard(stream(), asyncio.Event(), sink=sink, info=info, cancel_grace=None) as g:
                async for _ in g:
                    pass
        finally:
            await sink.aclose()
    await record(url, [("resp_plain", "completed")])


async def execute(url: str, *statements: Any) -> None:
    engine = _db.create_engine(_db.resolve_url(url))
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(statement)
    finally:
        await engine.dispose()


def tamper(url: str) -> None:
    """What the guard would never store, but a database can hold: hostile strings everywhere."""
    old = datetime.now(UTC) - timedelta(days=3)
    r, t = responses.c, transitions.c
    asyncio.run(
        execute(
            url,
            # stats: a hostile cause; verify: the status disagrees, and the cause is hostile
            update(responses).where(r.response_id == "resp_plain").values(cause=HOSTILE[:32]),
            # verify: an event stored after the terminal, with a hostile type
            insert(events).values(
                response_id=RID, attempt=1, seq=99, type="z" + HOSTILE[:100], payload={}, recorded_at=old
            ),
            # recover: a stuck row with a hostile id
            insert(responses).values(
                response_id="resp_stuck" + HOSTILE[:60], status="in_progress", updated_at=old, created_at=old
            ),
            insert(transitions).values(
                response_id="resp_stuck" + HOSTILE[:60],
                attempt=1,
                idx=0,
                from_state="new",
                to_state="in_progress",
                cause=None,
                reason="r" + HOSTILE,
                at=old,
            ),
            update(transitions)
            .where(t.response_id == "resp_plain", t.to_state == "completed")
            .values(reason="why" + HOSTILE),
        )
    )


def check_escapes(url: str) -> None:
    cli = Cli(url)
    asyncio.run(fill_hostile(url))
    tamper(url)

    listed = cli("responses", "list")
    assert listed.exit_code == 0, listed.output
    printable_output(listed.stdout)
    assert RID_SHOWN in listed.stdout and "agent\\x1b[31mRED" in listed.stdout

    shown = cli("responses", "show", RID)
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    printable_output(out)
    assert out.startswith(RID_SHOWN)
    assert ("boom " + HOSTILE_SHOWN) in out  # the error text, in full, markup and all as text
    for field in ("agent", "conv", "chain", "pk"):
        assert field + HOSTILE_SHOWN[:40] in out
    assert "x.\\x1b[31mRED" in out  # the event type, in the events table
    assert "late.\\x1b[31mRED" in out  # the anomaly's event type

    statuses = cli("stats")
    assert statuses.exit_code == 0, statuses.output
    printable_output(statuses.stdout)
    assert "\\x1b[31mRED\\x1b[0m\\x1b]0;pwned" in statuses.stdout  # the hostile cause

    checked = cli("verify")
    assert checked.exit_code == 1, checked.output
    printable_output(checked.stdout)
    assert "z\\x1b[31mRED" in checked.stdout and RID_SHOWN in checked.stdout

    recovered = cli("recover", "--older-than", "1d")
    assert recovered.exit_code == 0, recovered.output
    printable_output(recovered.stdout)
    assert "resp_stuck\\x1b[31mRED" in recovered.stdout

    shown = cli("responses", "show", "resp_stuck" + HOSTILE[:60])
    printable_output(shown.stdout)
    assert "r" + HOSTILE_SHOWN in shown.stdout  # a transition's reason

    # JSON: valid, and the stored strings come back exactly.
    data = json.loads(cli("responses", "list", "--json").stdout)
    assert {row["response_id"] for row in data} >= {RID, "resp_stuck" + HOSTILE[:60]}
    history = json.loads(cli("responses", "show", RID, "--json").stdout)
    assert history["response"]["error_message"] == "boom " + HOSTILE
    assert history["response"]["agent_name"] == "agent" + HOSTILE[:100]
    for args in (["stats", "--json"], ["verify", "--json"], ["recover", "--older-than", "1d", "--json"]):
        result = cli(*args)
        assert result.stdout.isascii()
        json.loads(result.stdout)

    # A hostile argument in an error; a hostile revision in the database.
    missing = cli("responses", "show", "nope" + ESC)
    assert missing.exit_code == 2 and missing.stderr.strip().isprintable()
    asyncio.run(_set_revision(url, "rev" + HOSTILE[:20]))
    current = cli("db", "current")
    assert current.exit_code == 0, current.output
    printable_output(current.stdout)
    assert "rev\\x1b[31mRED" in current.stdout
    upgrade = cli("db", "upgrade")
    assert upgrade.exit_code == 2
    assert "rev\\x1b[31mRED" in upgrade.stderr and upgrade.stderr.strip().isprintable()


async def _set_revision(url: str, revision: str) -> None:
    await execute(url, text(f"UPDATE {VERSION_TABLE} SET version_num = :v").bindparams(v=revision))


def test_stored_strings_are_escaped_sqlite(db_url: str) -> None:
    check_escapes(db_url)


@pytest.mark.postgres
def test_stored_strings_are_escaped_postgres(pg_database: str) -> None:
    check_escapes(f"postgresql://postgres@127.0.0.1:5432/{pg_database}")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, [markup] and :emoji: stay", "plain text, [markup] and :emoji: stay"),
        ("C:\\path\\x", "C:\\path\\x"),
        ("é ü 日本 🙂", "é ü 日本 🙂"),
        ("nul\x00", "nul\\x00"),
        ("\t\n\r", "\\t\\n\\r"),
        ("\x1b[2J\x7f", "\\x1b[2J\\x7f"),
        ("\x80\x9b\x9f", "\\x80\\x9b\\x9f"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c\u2028\u2029\ufeff\u200b", "\\u200e\\u200f\\u061c\\u2028\\u2029\\ufeff\\u200b"),
        ("lone \udcff and \ud800", "lone \\udcff and \\ud800"),
        ("\U000e0001", "\\U000e0001"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert _common.printable(raw) == shown
    assert _common.printable(raw).isprintable()


def test_nul_and_surrogates_in_every_printer(capsys: pytest.CaptureFixture[str]) -> None:
    """What the recorder may not store yet, the printers already handle."""
    hostile = "a\x00b\udcffc\x1b[31m[bold]d[/bold]"
    _common.say(f"line {hostile}")
    _common.out.print(_common.table("t" + hostile, ["col" + hostile], [[hostile], [None]]))
    _common.emit_json({"id": hostile, hostile: [hostile]})
    out = capsys.readouterr().out
    printable_output(out.split("{", 1)[0])
    assert out.count("a\\x00b\\udcffc\\x1b[31m[bold]d[/bold]") >= 4  # line, title, header, cell
    assert json.loads("{" + out.split("{", 1)[1]) == {"id": hostile, hostile: [hostile]}
    assert _common.one_line("error\nsecond line \x1b[0m") == "error\\nsecond line \\x1b[0m"
