"""Hostile command-line arguments, counted: every argument that reaches ``ResponseStore`` (``responses
show ID``, ``recover --expired-leases``, ``prune``, ``verify``, ``--since``, ``--schema``, ...) gets an
exact answer or one clear line and exit code 2; never a traceback, a raw control character on the
terminal, a misplaced "cannot use the database", or a hang (each call is bounded).

The values are :data:`tests._hostile.STRINGS` and ``LOOKALIKES`` (NUL cannot be in a real argv, but
``CliRunner`` passes any string; a real argv's undecodable bytes arrive as lone surrogates, checked
once through a real process). SQLite, and PostgreSQL through ``--schema``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from eventguard import ResponseStore, SqlResponseProvider, guard
from eventguard.cli import app
from eventguard.errors import InvalidQueryError
from eventguard.provider import _key, _partition
from eventguard.replicas import leases as lease_sql
from eventguard.sink import SqlSink
from eventguard.store import stored_id
from tests._hostile import LOOKALIKES, STRINGS, Tally, record
from tests._postgres import PG_URL, fresh_schema

from .conftest import STEP, script

VALUES: dict[str, str] = {**STRINGS, **LOOKALIKES}
CALL = 120.0  # seconds one command may take before it counts as a hang


def invoke(args: list[str]) -> Result:
    """One command, bounded: a call still running after :data:`CALL` seconds fails the test."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    running = pool.submit(CliRunner().invoke, app, args)
    try:
        return running.result(timeout=CALL)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"eventguard {' '.join(a[:40] for a in args)[:200]!a} still running after {CALL} s")
    finally:
        pool.shutdown(wait=False)  # a hung call is left behind, not waited for


def terminal_safe(text: str) -> bool:
    """Nothing a terminal would act on: printable characters and newlines only."""
    return all(line.isprintable() for line in text.split("\n"))


# -- the database the commands read ---------------------------------------------------------------


def _ids() -> dict[str, str]:
    return {kind: value + f"#s{n}" for n, (kind, value) in enumerate(VALUES.items())}


async def _stream(rid: str) -> AsyncIterator[dict[str, Any]]:
    for event in script(rid, "completed"):
        yield event


async def _fill(url: str, schema: str | None, spool: Path, ids: dict[str, str]) -> None:
    """Each id recorded by the sink, stored by the host's store, and leased by a dead replica."""
    async with asyncio.timeout(STEP * 4):
        async with SqlSink(url, schema=schema, spool_path=spool) as sink:
            for rid in ids.values():
                async with guard(_stream(rid), asyncio.Event(), sink=sink) as g:
                    async for _ in g:
                        pass
        provider = SqlResponseProvider(url, schema=schema)
        try:
            for rid in ids.values():
                await provider.create_response({"id": rid, "status": "in_progress", "output": []}, None, None)
                leased = {"id": rid + "/leased", "status": "in_progress", "output": []}
                async with provider.engine.begin() as conn:  # leased first: a stored id is taken
                    token = await lease_sql.claim(
                        conn, partition=_partition(None), key=_key(leased["id"]), response_id=leased["id"],
                        owner="dead-replica", lease=-1.0, takeover=False,
                    )  # fmt: skip
                assert token == 1
                await provider.create_response(leased, None, None)
        finally:
            await provider.aclose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """The ``--database-url`` (and ``--schema``) arguments of a database holding :func:`_ids`."""
    ids = _ids()
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'hostile.db'}"
        asyncio.run(_fill(url, None, tmp_path / "spool.jsonl", ids))
        yield ["--database-url", url]
        return
    loop = asyncio.new_event_loop()
    schema_cm = fresh_schema("eg_cli_hostile")
    try:
        schema = loop.run_until_complete(schema_cm.__aenter__())
    except BaseException:
        loop.close()
        raise
    try:
        asyncio.run(_fill(PG_URL, schema, tmp_path / "spool.jsonl", ids))
        yield ["--database-url", PG_URL, "--schema", schema]
    finally:
        loop.run_until_complete(schema_cm.__aexit__(None, None, None))
        loop.close()


# -- stored hostile ids, found exactly -----------------------------------------------------------


def test_responses_show_finds_each_hostile_id_and_prints_it_escaped(database: list[str]) -> None:
    tally = Tally()
    for kind, rid in _ids().items():
        as_json = invoke(["responses", "show", rid, "--json", *database])
        plain = invoke(["responses", "show", rid, *database])
        by_stored = invoke(["responses", "show", stored_id(rid), "--json", *database])
        if as_json.exit_code != 0 or plain.exit_code != 0 or by_stored.exit_code != 0:
            tally.bad(
                kind,
                f"exit {as_json.exit_code}/{plain.exit_code}/{by_stored.exit_code}: {plain.output[:200]!a}",
            )
            continue
        shown = json.loads(as_json.stdout)
        envelopes = [e["envelope"]["id"] for e in shown.get("envelopes", [])]
        if shown["response"]["response_id"] != stored_id(rid) or envelopes != [rid]:
            tally.bad(
                kind, f"JSON names {shown['response']['response_id']!a:.80}, envelopes {envelopes!a:.80}"
            )
        elif json.loads(by_stored.stdout) != shown:
            tally.bad(kind, "the stored form finds another response")
        elif not terminal_safe(plain.stdout) or "host's store  in_progress" not in plain.stdout:
            tally.bad(kind, f"plain output {plain.stdout[:200]!a}")
        else:
            tally.exact()
    line = record(tally, f"cli {database[1].split(':')[0]} responses show (stored ids)")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(VALUES), line


def test_recover_expired_leases_names_each_hostile_id_exactly_once(database: list[str]) -> None:
    tally = Tally()
    leased = {kind: rid + "/leased" for kind, rid in _ids().items()}
    done = invoke(["recover", "--expired-leases", "--older-than", "30d", "--json", *database])
    assert done.exit_code == 0, done.output
    marked = json.loads(done.stdout)["marked"]
    for kind, rid in leased.items():
        tally.exact() if marked.count(rid) == 1 else tally.bad(kind, f"marked {marked.count(rid)} times")
    assert sorted(marked) == sorted(leased.values())
    again = invoke(["recover", "--expired-leases", "--older-than", "30d", *database])
    assert again.exit_code == 0 and terminal_safe(again.stdout), again.output
    line = record(tally, f"cli {database[1].split(':')[0]} recover --expired-leases")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(VALUES), line


# -- hostile arguments: one clear line, exit code 2 ------------------------------------------------

#: Where a hostile argument goes: the command line around it.
ARGUMENTS: dict[str, list[str]] = {
    "show an unknown id": ["responses", "show", "{v}"],
    "prune --older-than": ["prune", "--older-than", "{v}"],
    "recover --older-than": ["recover", "--expired-leases", "--older-than", "{v}"],
    "recover --policy": ["recover", "--older-than", "1d", "--policy", "{v}"],
    "verify --show": ["verify", "--show", "{v}"],
    "list --since": ["responses", "list", "--since", "{v}"],
    "list --status": ["responses", "list", "--status", "{v}"],
    "list --limit": ["responses", "list", "--limit", "{v}"],
}
#: Values peculiar to the options: numbers out of range, durations past the calendar.
EXTRA: dict[str, str] = {
    "huge_duration": "99999999999999d",
    "infinite_duration": "1" + "0" * 400 + "s",
    "negative": "-1",
    "empty": "",
}


@pytest.mark.parametrize("where", list(ARGUMENTS))
def test_a_hostile_argument_gets_one_clear_line_and_exit_code_2(where: str, database: list[str]) -> None:
    tally = Tally()
    for kind, value in {**VALUES, **EXTRA}.items():
        args = [a.replace("{v}", value) for a in ARGUMENTS[where]]
        got = invoke([*args, *database])
        said = got.output.strip()
        if got.exit_code == 0:
            tally.exact()  # taken as it is (an id, a time) and answered: nothing to refuse
        elif got.exit_code != 2 or "\n" in said or not said.startswith("eventguard: error:"):
            tally.bad(kind, f"exit {got.exit_code}: {said[:300]!a}")
        elif "Traceback" in said or not terminal_safe(said) or len(said) > 3000:
            tally.bad(kind, f"unsafe line: {said[:300]!a}")
        elif "cannot use the database" in said:
            tally.bad(kind, f"blames the database: {said[:300]!a}")
        else:
            tally.refused("exit_2")
    line = record(tally, f"cli {database[1].split(':')[0]} {where}")
    assert tally.wrong == [], line
    assert tally.went_in == len(VALUES) + len(EXTRA), line


def test_a_hostile_revision_or_spool_path_gets_one_clear_line_not_the_databases_blame(tmp_path: Path) -> None:
    """``db`` and ``spool`` commands, on a database of their own (a revision such as -1 is taken).
    Before: an empty or unprintable REVISION, a bad ``--from``, a ``--spool`` that is not a spool
    or cannot be a file were each said as "cannot use the database ...: ValueError" (or
    AssertionError)."""
    sqlite = ["--database-url", f"sqlite:///{tmp_path / 'own.db'}"]
    assert invoke(["db", "upgrade", *sqlite]).exit_code == 0
    (tmp_path / "settings.json").write_text('{"debug": true}\n')
    tally = Tally()
    for kind, value in {**VALUES, **EXTRA, "not_a_spool": "settings.json", "too_long": "x" * 5000}.items():
        for args in (
            ["db", "stamp", value, *sqlite],
            ["db", "upgrade", "--sql", "--from", value, *sqlite],
            ["db", "upgrade", value, *sqlite],
            ["db", "downgrade", value, *sqlite],
            ["spool", "replay", "--spool", str(tmp_path / value), *sqlite],
        ):
            if args[0] == "spool" and "\x00" in value:
                # No real argv holds a NUL; the oldest click we allow stats the path itself, in
                # its own option parsing, and raises ValueError there (exit 1, no message).
                tally.refused("no_real_argv")
                continue
            got = invoke(args)
            said = got.output.strip()
            if got.exit_code == 0:
                tally.exact()
            elif got.exit_code != 2 or "\n" in said or not said.startswith("eventguard: error:"):
                tally.bad(f"{kind} {args[:2]}", f"exit {got.exit_code}: {said[:300]!a}")
            elif "cannot use the database" in said or not terminal_safe(said) or len(said) > 3000:
                tally.bad(f"{kind} {args[:2]}", f"said: {said[:300]!a}")
            else:
                tally.refused("exit_2")
            if args[1] == "downgrade" and got.exit_code == 0:
                assert invoke(["db", "upgrade", *sqlite]).exit_code == 0  # back to head for the next
    line = record(tally, "cli db REVISION / spool --spool")
    assert tally.wrong == [], line
    assert tally.went_in == 5 * (len(VALUES) + len(EXTRA) + 2), line
    assert (tmp_path / "settings.json").read_text() == '{"debug": true}\n'


def test_a_hostile_schema_or_url_gets_one_clear_line_and_exit_code_2(tmp_path: Path) -> None:
    tally = Tally()
    sqlite = f"sqlite:///{tmp_path / 'none.db'}"
    for kind, value in VALUES.items():
        for args in (
            ["responses", "list", "--database-url", value],
            ["responses", "list", "--database-url", "sqlite:///" + value],
            ["verify", "--database-url", sqlite, "--schema", value],
        ):
            got = invoke(args)
            said = got.output.strip()
            ok = got.exit_code == 2 and said.startswith("eventguard: error:") and "\n" not in said
            if ok and terminal_safe(said) and len(said) <= 3000:
                tally.refused("exit_2")
            else:
                tally.bad(f"{kind} {args[-2]}", f"exit {got.exit_code}: {said[:300]!a}")
    line = record(tally, "cli --database-url / --schema")
    assert tally.wrong == [], line
    assert tally.went_in == 3 * len(VALUES), line


def test_a_real_argv_of_undecodable_bytes_and_escapes_is_said_escaped(tmp_path: Path) -> None:
    """Through a real process: the bytes arrive as lone surrogates (surrogateescape)."""
    url = f"sqlite:///{tmp_path / 'argv.db'}"
    assert invoke(["db", "upgrade", "--database-url", url]).exit_code == 0
    code = "import sys; from eventguard.cli import main; sys.argv[0] = 'eventguard'; main()"
    argv = [sys.executable, "-c", code, "responses", "show", b"resp\xff\x1b[31m\x07", "--database-url", url]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(argv, capture_output=True, timeout=CALL, env=env, check=False)
    said = done.stderr.decode("utf-8", "replace").strip()
    assert done.returncode == 2, said
    assert said == "eventguard: error: unknown response id 'resp\\udcff\\x1b[31m\\x07'"


def test_the_store_refuses_an_age_past_the_calendar_as_a_bad_query(tmp_path: Path) -> None:
    async def prune() -> None:
        async with asyncio.timeout(STEP), ResponseStore(f"sqlite:///{tmp_path / 'age.db'}") as store:
            with pytest.raises(InvalidQueryError, match="before the year 1"):
                await store.prune(older_than=timedelta.max)
            with pytest.raises(InvalidQueryError, match="before the year 1"):
                await store.prune_envelopes(older_than=timedelta(days=999_999_999))

    asyncio.run(prune())


def test_scrubbing_a_megabyte_of_letters_finishes() -> None:
    code = "from eventguard.sql.engine import scrub; scrub('m' * (1 << 20))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    try:
        subprocess.run([sys.executable, "-c", code], timeout=30, env=env, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("scrub() of a megabyte of letters was still running after 30 s")
