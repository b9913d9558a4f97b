"""The host's agent sessions in SQL (``eventguard_agent_sessions``) in the maintenance commands, on
SQLite and a fresh PostgreSQL schema: ``eventguard prune`` expires the sessions last written before
its cutoff (and says how many), ``eventguard verify`` reports a stored session that does not read
back as the host's (and exits 1), ``eventguard sessions`` lists them; hostile session ids and
contents (NUL, a lone surrogate, an ANSI escape, a megabyte) come back exact in ``--json`` and
escaped and bounded in the tables."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from agent_framework import AgentSession
from azure.ai.agentserver.core import FoundryAgentRequestContext
from sqlalchemy import update
from typer.testing import CliRunner

from eventguard.agent_sessions import SqlAgentSessionStoreProvider
from eventguard.cli import app
from eventguard.envelopes import key
from eventguard.sql.tables import agent_sessions
from eventguard.store import ResponseStore
from eventguard.verify import verify
from tests._hostile import STRINGS
from tests._postgres import sqlite_or_postgres

TIMEOUT = 60
HOSTILE = ["nul", "lone_surrogate", "ansi_escape", "one_megabyte"]
#: What a table may print for a megabyte id: the id cut to a few hundred characters, not all of it.
BOUNDED = 50_000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(URL, schema): an SQLite file, or a fresh PostgreSQL schema of this test's own."""
    with sqlite_or_postgres(request.param, tmp_path, "eg_sessions") as where:
        yield where


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(TIMEOUT):
            return await coro

    return asyncio.run(bounded())


def _session(text: str) -> AgentSession:
    session = AgentSession(session_id=text, service_session_id=text)
    session.state[text] = {"text": text, "n": 3}
    return session


def _ids() -> dict[str, str]:
    """Session id -> the content stored under it: the hostile strings, and a plain one."""
    return {**{f"conv_{case}_{STRINGS[case]}": STRINGS[case] for case in HOSTILE}, "conv_plain": "hello"}


async def _fill(url: str, schema: str | None, ids: dict[str, str], *, age: timedelta | None = None) -> None:
    """Store each session through the host's store; ``age``: then backdate them by that much."""
    provider = SqlAgentSessionStoreProvider(url, schema=schema)
    try:
        store = provider.get_store(config=None, platform_context=FoundryAgentRequestContext(user_id="u1"))
        for session_id, text in ids.items():
            await store.set(session_id, _session(text))
        if age is not None:
            keys = [key(session_id) for session_id in ids]
            async with provider.provider.transactions.open("write") as conn:
                await conn.execute(
                    update(agent_sessions)
                    .where(agent_sessions.c.session_key.in_(keys))
                    .values(updated_at=datetime.now(UTC) - age)
                )
    finally:
        await provider.provider.aclose()


async def _corrupt(url: str, schema: str | None, row_of: str, **values: str) -> None:
    """Overwrite columns of the row the session ``row_of`` is stored in."""
    provider = SqlAgentSessionStoreProvider(url, schema=schema)
    try:
        async with provider.provider.transactions.open("write") as conn:
            done = await conn.execute(
                update(agent_sessions).where(agent_sessions.c.session_key == key(row_of)).values(**values)
            )
            assert done.rowcount == 1
    finally:
        await provider.provider.aclose()


async def _stored(url: str, schema: str | None) -> dict[str, dict[str, Any] | None]:
    async with ResponseStore(url, schema=schema) as store:
        return {r.session_id: r.session async for r in store.iter_agent_sessions(batch=2)}


def _cli(url: str, schema: str | None, *args: str) -> Any:
    argv = [*args, "--database-url", url, *(["--schema", schema] if schema else [])]
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def _escaped_and_bounded(output: str) -> None:
    assert "\x1b" not in output and "\x00" not in output and "\udcff" not in output
    assert len(output) < BOUNDED, len(output)


def test_prune_expires_the_sessions_last_written_before_the_cutoff(db: tuple[str, str | None]) -> None:
    url, schema = db
    old = _ids()
    new = {"conv_kept": "kept", **{f"kept_{case}_{STRINGS[case]}": STRINGS[case] for case in HOSTILE[:2]}}
    _run(_fill(url, schema, old, age=timedelta(days=3)))
    _run(_fill(url, schema, new))

    pruned = _cli(url, schema, "prune", "--older-than", "1d", "--json")
    assert pruned.exit_code == 0, pruned.output
    assert json.loads(pruned.stdout)["agent_sessions"] == len(old)
    stored = _run(_stored(url, schema))
    assert set(stored) == set(new)
    assert all(stored[i] == _session(text).to_dict() for i, text in new.items())

    said = _cli(url, schema, "prune", "--older-than", "1d")
    assert said.exit_code == 0, said.output
    assert "pruned the host's agent sessions last written more than 1d ago: 0" in said.stdout


def test_verify_reports_the_sessions_that_do_not_read_back(db: tuple[str, str | None]) -> None:
    url, schema = db
    ids = _ids()
    _run(_fill(url, schema, ids))
    good = _cli(url, schema, "verify", "--json")
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["agent_sessions"] == len(ids)

    megabyte, ansi, nul = (f"conv_{case}_{STRINGS[case]}" for case in ("one_megabyte", "ansi_escape", "nul"))
    _run(_corrupt(url, schema, megabyte, value="not json"))
    _run(_corrupt(url, schema, ansi, value='["a list"]'))
    _run(_corrupt(url, schema, nul, value='{"session_id": 5}'))
    _run(_corrupt(url, schema, "conv_plain", session_id="conv_other"))  # not the id its row is keyed by

    async def report() -> Any:
        async with ResponseStore(url, schema=schema) as store:
            return await verify(store)

    found = _run(report())
    assert not found.ok and found.agent_sessions == len(ids)
    problems = {b.session_id: b.problem for b in found.bad_agent_sessions}
    assert set(problems) == {megabyte, ansi, nul, "conv_other"}
    assert "does not decode" in problems[megabyte]
    assert problems[ansi] == "the stored session is an array, not an object"
    assert problems[nul] == "the stored session's session_id is not a string"
    assert problems["conv_other"] == "its stored id is not the one its row is keyed by"

    as_json = _cli(url, schema, "verify", "--json")
    assert as_json.exit_code == 1, as_json.output
    assert {b["session_id"] for b in json.loads(as_json.stdout)["bad_agent_sessions"]} == set(problems)
    shown = _cli(url, schema, "verify")
    assert shown.exit_code == 1, shown.output
    _escaped_and_bounded(shown.stdout)
    assert "conv_ansi_escape_a\\x1b[31mred" in shown.stdout
    assert f"checked {len(ids)} agent sessions: 4 do not read back" in shown.stdout


def test_sessions_lists_them_exact_in_json_and_escaped_in_the_table(db: tuple[str, str | None]) -> None:
    url, schema = db
    ids = _ids()
    _run(_fill(url, schema, ids))

    as_json = _cli(url, schema, "sessions", "--json")
    assert as_json.exit_code == 0, as_json.output
    listed = {r["session_id"]: r for r in json.loads(as_json.stdout)}
    assert set(listed) == set(ids)
    for session_id, text in ids.items():
        assert listed[session_id]["session"] == _session(text).to_dict()
        assert listed[session_id]["problem"] is None and listed[session_id]["version"] == 1

    shown = _cli(url, schema, "sessions")
    assert shown.exit_code == 0, shown.output
    _escaped_and_bounded(shown.stdout)
    megabyte = f"conv_one_megabyte_{STRINGS['one_megabyte']}"
    assert "conv_plain" in shown.stdout and f"({len(megabyte)} characters)" in shown.stdout
    assert "conv_ansi_escape_a\\x1b[31mred" in shown.stdout
    assert "conv_nul_a\\x00b" in shown.stdout

    assert _cli(url, schema, "sessions", "--limit", "1", "--json").exit_code == 0
    only = json.loads(_cli(url, schema, "sessions", "--limit", "1", "--json").stdout)
    assert len(only) == 1
