"""Several replicas of a guarded server on one PostgreSQL database behave as one server.

Each replica is a real process (``tests/upstream/_replica_child.py``, uvicorn on a loopback port,
started by the provider tests' ``lifetime``), driven by the ``openai`` client and plain HTTP. Leases
are short (1.5 s) so failover costs seconds. One row of README "Several replicas" per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, NamedTuple

import asyncpg  # type: ignore[import-untyped]
import httpx
import pytest
from azure.ai.agentserver.responses._id_generator import IdGenerator

from tests.upstream.test_provider_e2e import Database, Lifetime, client, lifetime, wait_status

pytestmark = [pytest.mark.upstream]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
DB_NAME = "h_r16"
PG_DSN = f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}"
PG_URL = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{DB_NAME}"
LEASE = "1.5"
STEP = 30.0


class SqliteReader:
    """``fetchval``/``fetchrow`` of asyncpg's shape over a SQLite file (``$1`` becomes ``?``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _rows(self, sql: str, args: tuple[Any, ...]) -> list[sqlite3.Row]:
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
            conn.row_factory = sqlite3.Row
            try:
                return conn.execute(sql.replace("$1", "?"), args).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise

    async def fetchval(self, sql: str, *args: Any) -> Any:
        rows = await asyncio.to_thread(self._rows, sql, args)
        return rows[0][0] if rows else None

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        rows = await asyncio.to_thread(self._rows, sql, args)
        return rows[0] if rows else None


USER = {"x-agent-user-id": "alice"}
#: The partition of USER's rows (``eventguard.envelopes.key`` of the user: its SHA-256).
USER_PARTITION = hashlib.sha256(b"alice").hexdigest()


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"])
async def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Database, Any]]:
    """PostgreSQL (LISTEN/NOTIFY and polling) or a SQLite file several processes share (polling)."""
    if request.param == "sqlite":
        path = tmp_path / "replicas.db"
        yield Database(f"sqlite:///{path}", None), SqliteReader(path)
        return
    async for found in _postgres():
        yield found


@pytest.fixture
async def db() -> AsyncIterator[tuple[Database, Any]]:
    async for found in _postgres():
        yield found


class Pair(NamedTuple):
    """Two replicas, A and B, on the ``db`` fixture's schema, and a connection to that schema."""

    conn: Any
    a: Lifetime
    b: Lifetime


@pytest.fixture
async def pair(db: tuple[Database, Any], tmp_path: Path) -> AsyncIterator[Pair]:
    """Two replicas on PostgreSQL with the default timing and policy, stopped after the test."""
    database, conn = db
    async with AsyncExitStack() as stack:
        a, b = await replicas(stack, database, tmp_path, 2)
        yield Pair(conn, a, b)


async def _postgres() -> AsyncIterator[tuple[Database, Any]]:
    """A schema of its own in the ``h_r16`` database (created when missing), and a connection to it."""
    try:
        async with asyncio.timeout(5):
            admin = await asyncpg.connect(PG_ADMIN)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.skip(f"no PostgreSQL server reachable at {PG_ADMIN}: {type(exc).__name__}: {exc}")
    async with asyncio.timeout(30):
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DB_NAME):
            await admin.execute(f'CREATE DATABASE "{DB_NAME}"')
        await admin.close()
        conn = await asyncpg.connect(PG_DSN)
    schema = f"eg_rep_{uuid.uuid4().hex[:12]}"
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(f'SET search_path TO "{schema}"')
    try:
        yield Database(PG_URL, schema), conn
    finally:
        async with asyncio.timeout(30):
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()


async def replicas(
    stack: AsyncExitStack,
    database: Database,
    root: Path,
    n: int,
    policy: str = "failed",
    timing: list[tuple[str, str]] | None = None,
) -> list[Lifetime]:
    """``n`` replicas on the database, started one after the other (the first creates the schema),
    reaping by ``policy``; ``timing``: each replica's (heartbeat, reap_every), ``-`` the default."""
    started = []
    for i in range(n):
        state = root / f"replica-{i}"
        state.mkdir()
        heartbeat, reap_every = timing[i] if timing else ("-", "-")
        started.append(
            await stack.enter_async_context(
                lifetime(database, state, "uvicorn", "chat", module="tests.upstream._replica_child",
                         args=(LEASE, policy, heartbeat, reap_every))
            )
        )  # fmt: skip
    return started


async def poll(query: Any, what: str) -> Any:
    """Run ``query()`` until it returns something truthy (bounded by STEP); that value."""
    async with asyncio.timeout(STEP):
        while not (found := await query()):  # noqa: ASYNC110 - state another process owns
            await asyncio.sleep(0.05)
    assert found, what
    return found


def new_id() -> str:
    return IdGenerator.new_response_id()


async def post(
    base: str, text: str, response_id: str | None = None, background: bool = True
) -> httpx.Response:
    headers = {"x-agent-response-id": response_id} if response_id else {}
    async with httpx.AsyncClient(timeout=STEP) as http:
        return await http.post(
            f"{base}/responses", json={"model": "m", "input": text, "background": background}, headers=headers
        )


async def started_on(conn: Any, response_id: str) -> None:
    """Wait until the response's lease is taken (its handler runs)."""
    sql = "SELECT 1 FROM eventguard_leases WHERE response_id = $1 AND state = 'running'"
    await poll(lambda: conn.fetchval(sql, f'"{response_id}"'), "the lease")


async def started_run(conn: Any, owner: Lifetime, text: str = "hang") -> str:
    """The id of a background response POSTed to ``owner`` (answered 200), once its lease is taken."""
    rid = new_id()
    assert (await post(owner.base_url, text, rid)).status_code == 200
    await started_on(conn, rid)
    return rid


@pytest.mark.postgres
async def test_a_post_reusing_an_id_live_or_stored_on_another_replica_gets_the_owners_409(pair: Pair) -> None:
    conn, a, b = pair
    rid = await started_run(conn, a)
    on_owner, elsewhere = await post(a.base_url, "hang", rid), await post(b.base_url, "hang", rid)
    assert on_owner.status_code == elsewhere.status_code == 409
    assert elsewhere.json()["error"]["code"] == on_owner.json()["error"]["code"] == "response_id_conflict"
    async with client(a.base_url) as ca:
        await ca.responses.cancel(rid)
        assert await wait_status(ca, rid, {"cancelled"}) == "cancelled"
    stored = await post(b.base_url, "again", rid)  # ended and stored: still taken
    assert stored.status_code == 409


@pytest.mark.postgres
async def test_an_id_the_host_stored_nothing_under_can_be_posted_again_on_any_replica(pair: Pair) -> None:
    """One server takes an id again after a POST it refused (400) or a ``store=false`` run: it kept
    nothing of either. The replicas ended the lease, and the corrected retry met a 409 everywhere."""
    conn, a, b = pair
    refused, unstored = new_id(), new_id()
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        bad = await http.post(
            f"{a.base_url}/responses",
            json={"model": "m", "input": 5},
            headers={"x-agent-response-id": refused},
        )
        assert bad.status_code == 400
        retried = await post(b.base_url, "hello", refused, background=False)
        assert retried.status_code == 200, retried.text
        assert retried.json()["status"] == "completed"
        first = await http.post(
            f"{a.base_url}/responses",
            json={"model": "m", "input": "hello", "store": False},
            headers={"x-agent-response-id": unstored},
        )
        assert first.status_code == 200 and first.json()["status"] == "completed"
        sql = "SELECT 1 FROM eventguard_leases WHERE response_id = $1 AND state <> 'running'"
        await poll(lambda: conn.fetchval(sql, f'"{unstored}"'), "the store=false run's lease let go")
        again = await http.post(
            f"{b.base_url}/responses",
            json={"model": "m", "input": "again", "store": False},
            headers={"x-agent-response-id": unstored},
        )
        assert again.status_code == 200, again.text


@pytest.mark.postgres
async def test_an_id_in_the_body_or_in_a_repeated_header_is_claimed_as_the_host_reads_it(pair: Pair) -> None:
    """The host takes a client-chosen id from the body's ``response_id`` too, and of a repeated
    header the first value. The relay claimed only the header, its last value: a second replica ran
    a live response's id again, and a lease was left running under an id nothing ran."""
    conn, a, b = pair
    in_body, never_run = new_id(), new_id()
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        body = {"model": "m", "input": "hang", "background": True, "response_id": in_body}
        assert (await http.post(f"{a.base_url}/responses", json=body)).status_code == 200
        await started_on(conn, in_body)
        again = await http.post(f"{b.base_url}/responses", json={**body, "input": "on B"})
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "response_id_conflict"
        rid = await started_run(conn, a)
        repeated = await http.post(
            f"{b.base_url}/responses",
            json={"model": "m", "input": "on B"},
            headers=[("x-agent-response-id", rid), ("x-agent-response-id", never_run)],
        )
        assert repeated.status_code == 409, repeated.text
    sql = "SELECT count(*) FROM eventguard_leases WHERE response_id = $1"
    assert await conn.fetchval(sql, f'"{never_run}"') == 0
    async with client(a.base_url) as ca:
        for live in (in_body, rid):
            await ca.responses.cancel(live)
            assert await wait_status(ca, live, {"cancelled"}) == "cancelled"


@pytest.mark.postgres
async def test_a_delete_of_a_response_in_flight_on_another_replica_is_refused_as_the_owner_refuses_it(
    pair: Pair,
) -> None:
    conn, a, b = pair
    rid = await started_run(conn, a)
    async with httpx.AsyncClient(timeout=STEP) as http:
        owner = await http.delete(f"{a.base_url}/responses/{rid}")
        other = await http.delete(f"{b.base_url}/responses/{rid}")
    assert owner.status_code == other.status_code == 400
    assert other.json()["error"]["message"] == owner.json()["error"]["message"]
    async with client(a.base_url) as ca:
        await ca.responses.cancel(rid)
        assert await wait_status(ca, rid, {"cancelled"}) == "cancelled"


async def test_a_cancel_on_another_replica_reaches_the_owner_as_a_client_cancel_and_answers_200(
    any_db: tuple[Database, Any], tmp_path: Path
) -> None:
    database, conn = any_db
    async with AsyncExitStack() as stack:
        a, b = await replicas(stack, database, tmp_path, 2)
        rid = await started_run(conn, a)
        async with client(b.base_url) as cb, client(a.base_url) as ca, asyncio.timeout(STEP):
            cancelled = await cb.responses.cancel(rid)
            assert cancelled.status == "cancelled"
            assert (await ca.responses.retrieve(rid)).status == "cancelled"
            assert (await cb.responses.retrieve(rid)).status == "cancelled"
        sql = "SELECT status, cause FROM eventguard_responses WHERE response_id = $1 AND status = 'cancelled'"
        row = await poll(lambda: conn.fetchrow(sql, rid), "the cancelled lifecycle")
        assert row["cause"] == "client_cancel"  # the guard saw the host's client cancel


async def test_a_cancel_on_another_replica_reaches_an_owner_whose_lease_renewal_is_late(
    any_db: tuple[Database, Any], tmp_path: Path
) -> None:
    """Under heavy load an owner's heartbeat can come later than its lease while the owner runs on:
    here A never renews (and nobody reaps), so its lease is past its expiry, still ``running``.
    The owner still takes relayed cancels and writes its terminal under its token; B must relay
    and answer as A would (200, cancelled), not its host's 404 from the ``in_progress`` store."""
    database, conn = any_db
    async with AsyncExitStack() as stack:
        late, never = ("3600", "3600"), ("-", "3600")
        a, b = await replicas(stack, database, tmp_path, 2, timing=[late, never])
        rid = new_id()
        assert (await post(a.base_url, "hang", rid)).status_code == 200
        await started_on(conn, rid)
        expiry = "SELECT lease_expires FROM eventguard_leases WHERE response_id = $1"
        expires = await conn.fetchval(expiry, f'"{rid}"')

        async def overdue() -> bool:  # the database runs on this host: one clock
            return time.time() > expires + 0.2

        await poll(overdue, "the lease past its expiry")
        async with client(b.base_url) as cb, client(a.base_url) as ca, asyncio.timeout(STEP):
            cancelled = await cb.responses.cancel(rid)
            assert cancelled.status == "cancelled"
            assert (await ca.responses.retrieve(rid)).status == "cancelled"
        sql = "SELECT status, cause FROM eventguard_responses WHERE response_id = $1 AND status = 'cancelled'"
        row = await poll(lambda: conn.fetchrow(sql, rid), "the cancelled lifecycle")
        assert row["cause"] == "client_cancel"
        lease = "SELECT state, ended_status FROM eventguard_leases WHERE response_id = $1"
        ended = await conn.fetchrow(lease, f'"{rid}"')
        assert (ended["state"], ended["ended_status"]) == ("ended", "cancelled")  # by the owner's write


async def killed_mid_run(conn: Any, owner: Any) -> str:
    """A background response started on ``owner``, which is SIGKILLed once it has run a moment."""
    rid = await started_run(conn, owner)
    await asyncio.sleep(0.5)  # let the sink flush the first events
    owner.process.send_signal(signal.SIGKILL)
    return rid


def identities(*servers: Any) -> set[str]:
    """The replica identities the servers printed at start."""
    return {server.printed("IDENTITY ")[0][9:] for server in servers}


@pytest.mark.postgres
async def test_a_killed_replicas_response_is_ended_once_by_one_survivor_after_its_lease(
    db: tuple[Database, Any], tmp_path: Path
) -> None:
    database, conn = db
    async with AsyncExitStack() as stack:
        a, b, c = await replicas(stack, database, tmp_path, 3)
        rid = await killed_mid_run(conn, a)
        ended = "SELECT 1 FROM eventguard_leases WHERE response_id = $1 AND state = 'ended'"
        await poll(lambda: conn.fetchval(ended, f'"{rid}"'), "the reaper")
        # (Polled in the database first: 2.2.0b1's host answers 404 for an in-flight background
        # run read from the store, whose envelope it stores without "background".)
        async with client(b.base_url) as cb, client(c.base_url) as cc:
            assert await wait_status(cb, rid, {"failed"}) == "failed"
            assert (await cc.responses.retrieve(rid)).status == "failed"
        lease = await conn.fetchrow("SELECT * FROM eventguard_leases WHERE response_id = $1", f'"{rid}"')
        assert lease["state"] == "ended" and lease["fencing_token"] == 2
        assert lease["ended_by"] in identities(b, c)
        sql = (
            "SELECT to_state, cause FROM eventguard_transitions"
            " WHERE response_id = $1 AND cause = 'owner_lost'"
        )
        ends = await conn.fetch(sql, rid)
        assert [(e["to_state"], e["cause"]) for e in ends] == [("failed", "owner_lost")]
        assert await conn.fetchval("SELECT count(*) FROM eventguard_events WHERE response_id = $1", rid) >= 1


@pytest.mark.postgres
async def test_with_the_interrupted_policy_a_killed_replicas_run_is_interrupted_once_and_left_for_a_restart(
    db: tuple[Database, Any], tmp_path: Path
) -> None:
    database, conn = db
    async with AsyncExitStack() as stack:
        a, b, c = await replicas(stack, database, tmp_path, 3, policy="interrupted")
        rid = await killed_mid_run(conn, a)
        taken = "SELECT 1 FROM eventguard_leases WHERE response_id = $1 AND state = 'interrupted'"
        await poll(lambda: conn.fetchval(taken, f'"{rid}"'), "the reaper")
        await asyncio.sleep(3 * float(LEASE))  # several more reaper passes of both survivors
        lease = await conn.fetchrow("SELECT * FROM eventguard_leases WHERE response_id = $1", f'"{rid}"')
        ended = (lease["state"], lease["ended_status"], lease["fencing_token"])
        assert ended == ("interrupted", "interrupted", 2)
        assert lease["ended_by"] in identities(b, c)
        sql = "SELECT to_state FROM eventguard_transitions WHERE response_id = $1 AND cause = 'owner_lost'"
        assert [e["to_state"] for e in await conn.fetch(sql, rid)] == ["interrupted"]  # exactly once
        sink_row = "SELECT status, cause FROM eventguard_responses WHERE response_id = $1"
        row = await conn.fetchrow(sink_row, rid)
        assert (row["status"], row["cause"]) == ("interrupted", "owner_lost")
        # The envelope is left as the owner stored it, for a restart of the owner to recover.
        envelope = "SELECT status FROM eventguard_provider_responses WHERE response_id = $1"
        assert await conn.fetchval(envelope, rid) == "in_progress"
        async with httpx.AsyncClient(timeout=STEP) as http:
            assert (await post(b.base_url, "again", rid)).status_code == 409  # the id stays taken
            for base in (b.base_url, c.base_url):
                assert (await http.get(f"{base}/responses/{rid}")).json()["status"] == "in_progress"


@pytest.mark.postgres
async def test_a_paused_replica_past_its_lease_cannot_overwrite_the_survivors_decision(pair: Pair) -> None:
    conn, a, b = pair
    rid = await started_run(conn, a, "slow")
    a.process.send_signal(signal.SIGSTOP)
    try:
        ended = "SELECT 1 FROM eventguard_leases WHERE response_id = $1 AND state = 'ended'"
        await poll(lambda: conn.fetchval(ended, f'"{rid}"'), "the reaper")
        async with client(b.base_url) as cb:
            assert await wait_status(cb, rid, {"failed", "completed"}) == "failed"
    finally:
        a.process.send_signal(signal.SIGCONT)
    # A wakes, finishes its run, and tries to write ``completed`` under its old token.
    # Its write ends either way: refused (an anomaly) or, were it not fenced, over B's envelope.
    sql = (
        "SELECT (SELECT count(*) FROM eventguard_anomalies"
        " WHERE response_id = $1 AND kind = 'fenced_out')"
        " + (SELECT count(*) FROM eventguard_provider_responses WHERE response_id = $1"
        " AND status = 'completed')"
    )
    await poll(lambda: conn.fetchval(sql, rid), "A's write after it woke")
    async with client(a.base_url) as ca, client(b.base_url) as cb:
        assert (await ca.responses.retrieve(rid)).status == "failed"
        assert (await cb.responses.retrieve(rid)).status == "failed"
    status = await conn.fetchval("SELECT status FROM eventguard_responses WHERE response_id = $1", rid)
    assert status == "failed"
    anomaly = "SELECT count(*) FROM eventguard_anomalies WHERE response_id = $1 AND kind = 'fenced_out'"
    assert await conn.fetchval(anomaly, rid) == 1  # refused, and recorded: never silently


@pytest.mark.postgres
@pytest.mark.parametrize("user", [{}, USER], ids=["anonymous", "a_user"])
async def test_a_foreground_stream_in_flight_is_not_found_on_every_replica_as_on_its_owner(
    pair: Pair, user: dict[str, str]
) -> None:
    # A platform user's run, its id left to the host: the lease is the one the handler takes, in that
    # user's partition, where the other replica looks for it (before the partition fix it was in the
    # anonymous one, and the other replica answered 200 from the store).
    conn, a, b = pair
    chosen = None if user else new_id()
    headers = {"x-agent-response-id": chosen} if chosen else user
    body = {"model": "m", "input": "slow", "stream": True}
    async with (
        httpx.AsyncClient(timeout=STEP) as http,
        asyncio.timeout(STEP),
        http.stream("POST", f"{a.base_url}/responses", json=body, headers=headers) as streaming,
    ):
        lines = streaming.aiter_lines()
        rid = chosen or (await _read_events(lines, 1))[0]["response"]["id"]
        await started_on(conn, rid)
        owner = await http.get(f"{a.base_url}/responses/{rid}", headers=user)
        other = await http.get(f"{b.base_url}/responses/{rid}", headers=user)
        assert (owner.status_code, other.status_code) == (404, 404)
        async for _line in lines:
            pass
        bases = (a.base_url, b.base_url)

        async def answers() -> list[httpx.Response] | None:
            got = [await http.get(f"{u}/responses/{rid}", headers=user) for u in bases]
            return got if all(r.status_code == 200 for r in got) else None

        # The response is stored (and its lease ended) after the stream's last line reaches us, so a
        # GET at once can still get the in-flight 404: wait for both to answer, then they must agree.
        got = await poll(answers, "both replicas answering the ended foreground response")
        assert [r.json()["status"] for r in got] == ["completed", "completed"]


def _text_of(body: dict[str, Any]) -> str:
    """The output text of a response as a GET answers it (every message part, joined)."""
    parts = [
        part.get("text") or ""
        for item in body.get("output") or []
        if isinstance(item, dict)
        for part in item.get("content") or []
        if isinstance(part, dict)
    ]
    return "".join(parts)


@pytest.mark.postgres
async def test_a_get_on_another_replica_shows_the_output_stored_so_far_before_the_terminal(
    pair: Pair,
) -> None:
    conn, a, b = pair
    rid = new_id()
    assert (await post(a.base_url, "slow", rid)).status_code == 200  # "a", "b", "c", 1 s apart
    stored = "SELECT 1 FROM eventguard_provider_responses WHERE response_id = $1"
    await poll(lambda: conn.fetchval(stored, rid), "the response.created envelope")
    seen: list[tuple[str, str]] = []
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        while True:
            got = (await http.get(f"{b.base_url}/responses/{rid}")).json()
            seen.append((got.get("status"), _text_of(got)))
            assert got.get("status") == "in_progress", f"ended before B showed any output: {seen}"
            if _text_of(got):
                break
            await asyncio.sleep(0.05)
        assert "abc".startswith(_text_of(got)) and got["output"][0]["type"] == "message"
        async with client(b.base_url) as cb:
            assert await wait_status(cb, rid, {"completed"}) == "completed"
        ended = (await http.get(f"{b.base_url}/responses/{rid}")).json()
        owner = (await http.get(f"{a.base_url}/responses/{rid}")).json()
        assert _text_of(ended) == _text_of(owner) == "abc", (ended, owner)


def _sse_events(body: str) -> list[dict[str, Any]]:
    """The events of an SSE body (its ``data:`` lines), keep-alive comments left out."""
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


async def _read_events(lines: AsyncIterator[str], n: int) -> list[dict[str, Any]]:
    """The next ``n`` events of a live SSE stream."""
    got: list[dict[str, Any]] = []
    async for line in lines:
        if line.startswith("data: "):
            got.append(json.loads(line[6:]))
            if len(got) == n:
                break
    return got


REPLAY_ELSEWHERE = "This response was streamed by another replica"


@contextlib.asynccontextmanager
async def streamed(
    http: httpx.AsyncClient, pair: Pair, text: str, user: str | None = None
) -> AsyncIterator[tuple[str, AsyncIterator[str], list[dict[str, Any]]]]:
    """A background streamed response of ``text`` posted to A with a new id, once its lease is taken:
    the id, its SSE lines and the first three events (created, in_progress, the message item).

    With ``user``: posted as that user (``x-agent-user-id``) and the id left to the host (read from
    its ``response.created``), so the lease is the one the handler takes (``claim_run``), not the
    one the middleware takes for a client-chosen id."""
    rid = new_id() if user is None else None
    headers = {"x-agent-response-id": rid} if rid is not None else {"x-agent-user-id": str(user)}
    body = {"model": "m", "input": text, "stream": True, "background": True}
    base = pair.a.base_url
    async with http.stream("POST", f"{base}/responses", json=body, headers=headers) as s:
        lines = s.aiter_lines()
        first = await _read_events(lines, 3)
        rid = rid if rid is not None else first[0]["response"]["id"]
        await started_on(pair.conn, rid)
        yield rid, lines, first


async def leases_of(conn: Any, response_id: str) -> list[tuple[str, str, str | None]]:
    """Every lease row of the response: (partition, state, ended_status)."""
    sql = "SELECT partition, state, ended_status FROM eventguard_leases WHERE response_id = $1"
    return [
        (r["partition"], r["state"], r["ended_status"]) for r in await conn.fetch(sql, f'"{response_id}"')
    ]


async def ended_leases(conn: Any, response_id: str) -> list[tuple[str, str, str | None]]:
    """The lease rows of the response once none is ``running`` (polled: the owner ends it after
    its answer)."""

    async def ended() -> list[tuple[str, str, str | None]] | None:
        found = await leases_of(conn, response_id)
        return found if found and all(state != "running" for _p, state, _s in found) else None

    found: list[tuple[str, str, str | None]] = await poll(ended, "the lease's end")
    return found


@pytest.mark.postgres
async def test_a_get_on_another_replica_shows_a_users_output_so_far_and_the_owners_write_ends_its_one_lease(
    pair: Pair,
) -> None:
    """A user's run (``x-agent-user-id``, the host's id) is leased in the user's partition, where the
    host stores it: B sees the live lease and folds the sink's events into its GET; A's terminal
    write ends that one lease, under its token."""
    conn, a, b = pair
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        async with streamed(http, pair, "slow", user=USER["x-agent-user-id"]) as (rid, lines, _first):
            seen: list[tuple[str, str]] = []
            while True:
                got = (await http.get(f"{b.base_url}/responses/{rid}", headers=USER)).json()
                seen.append((got.get("status"), _text_of(got)))
                assert got.get("status") == "in_progress", f"ended before B showed any output: {seen}"
                if _text_of(got):
                    break
                await asyncio.sleep(0.05)
            assert "abc".startswith(_text_of(got))
            async for _line in lines:
                pass
        assert await ended_leases(conn, rid) == [(USER_PARTITION, "ended", "completed")]
        stored = "SELECT partition FROM eventguard_provider_responses WHERE response_id = $1"
        assert [r["partition"] for r in await conn.fetch(stored, rid)] == [USER_PARTITION]
        owner = (await http.get(f"{a.base_url}/responses/{rid}", headers=USER)).json()
        other = (await http.get(f"{b.base_url}/responses/{rid}", headers=USER)).json()
        assert (owner["status"], other["status"]) == ("completed", "completed")
        assert _text_of(owner) == _text_of(other) == "abc"


@pytest.mark.postgres
async def test_a_users_run_in_flight_is_refused_deletion_on_another_replica_as_on_its_owner(
    pair: Pair,
) -> None:
    """DELETE of a user's in-flight run on B is refused as its owner refuses it."""
    _conn, a, b = pair
    user = USER["x-agent-user-id"]
    async with (
        httpx.AsyncClient(timeout=STEP) as http,
        asyncio.timeout(STEP),
        streamed(http, pair, "slow", user=user) as (rid, lines, _first),
    ):
        owner = await http.delete(f"{a.base_url}/responses/{rid}", headers=USER)
        other = await http.delete(f"{b.base_url}/responses/{rid}", headers=USER)
        assert (owner.status_code, other.status_code) == (400, 400), (owner.text, other.text)
        assert other.json()["error"]["message"] == owner.json()["error"]["message"]
        async for _line in lines:
            pass


@pytest.mark.postgres
async def test_a_users_run_in_flight_is_cancelled_through_another_replica(pair: Pair) -> None:
    """A cancel on B of a user's run is relayed to the owner, with the user's header: the owner's host
    cancels in the user's partition, the guard sees a client cancel, and the owner's write ends the lease."""
    conn, a, b = pair
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        async with streamed(http, pair, "hang", user=USER["x-agent-user-id"]) as (rid, _lines, _first):
            cancelled = await http.post(f"{b.base_url}/responses/{rid}/cancel", headers=USER)
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        sql = "SELECT status, cause FROM eventguard_responses WHERE response_id = $1 AND status = 'cancelled'"
        row = await poll(lambda: conn.fetchrow(sql, rid), "the cancelled lifecycle")
        assert row["cause"] == "client_cancel"  # the guard saw the host's client cancel
        for base in (a.base_url, b.base_url):
            assert (await http.get(f"{base}/responses/{rid}", headers=USER)).json()["status"] == "cancelled"
        assert await ended_leases(conn, rid) == [(USER_PARTITION, "ended", "cancelled")]  # the owner's write


@pytest.mark.postgres
async def test_a_replay_on_another_replica_says_only_the_replica_that_ran_it_can_serve_it(pair: Pair) -> None:
    conn, a, b = pair
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        async with streamed(http, pair, "slow") as (rid, lines, live):
            # The sink's row says background and stream (one flush after the first event).
            row = "SELECT 1 FROM eventguard_responses WHERE response_id = $1 AND stream AND background"
            await poll(lambda: conn.fetchval(row, rid), "the sink's row")
            mid_run = await http.get(f"{b.base_url}/responses/{rid}?stream=true&starting_after=2")
            async for line in lines:
                if line.startswith("data: "):
                    live.append(json.loads(line[6:]))
        owner = await http.get(f"{a.base_url}/responses/{rid}?stream=true&starting_after=2")
        other = await http.get(f"{b.base_url}/responses/{rid}?stream=true&starting_after=2")
        bad_cursor = await http.get(f"{b.base_url}/responses/{rid}?stream=true&starting_after=x")
    # The owner replays from its own stream store, numbered as it streamed them.
    replayed = _sse_events(owner.text)
    assert owner.status_code == 200 and replayed == live[3:] and replayed[-1]["type"] == "response.completed"
    for answer in (mid_run, other):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "stream")
        assert error["message"].startswith(REPLAY_ELSEWHERE)
    assert bad_cursor.status_code == 400 and bad_cursor.json()["error"]["param"] == "starting_after"
    # What a replay from the store would have to work from (docs/replicas.md, "Replay anywhere"):
    # here (nothing dropped, the agent framework numbering from 0) the stored order and the
    # host's numbers agree, event for event.
    sql = "SELECT seq, type FROM eventguard_events WHERE response_id = $1 ORDER BY seq"
    stored = [(row["seq"], row["type"]) for row in await conn.fetch(sql, rid)]
    assert stored == [(e["sequence_number"], e["type"]) for e in live]


@pytest.mark.postgres
async def test_a_replay_of_a_cancelled_stream_is_refused_on_every_replica_as_on_its_owner(pair: Pair) -> None:
    conn, a, b = pair
    async with httpx.AsyncClient(timeout=STEP) as http, asyncio.timeout(STEP):
        async with streamed(http, pair, "hang") as (rid, _lines, _first):
            cancelled = await http.post(f"{b.base_url}/responses/{rid}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        ended = "SELECT 1 FROM eventguard_responses WHERE response_id = $1 AND status = 'cancelled'"
        await poll(lambda: conn.fetchval(ended, rid), "the cancelled lifecycle")
        owner = await http.get(f"{a.base_url}/responses/{rid}?stream=true")
        other = await http.get(f"{b.base_url}/responses/{rid}?stream=true")
    # The owner deleted its replay when the run was cancelled: both hosts say so alike.
    assert owner.status_code == other.status_code == 400
    assert other.json() == owner.json()
