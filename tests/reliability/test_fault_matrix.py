"""Fault matrix, end to end: real ResponsesHostServer + GuardedResponses + SqlSink, 30-event responses.

For each fault x position (the fault fires just before inner event ``p``; ``p == 30`` is after the
last one) and each database, every case checks:

- no hang: each case runs under ``asyncio.timeout``; a ``TimeoutError`` fails the test, never swallowed;
- the inner stream is finalised exactly once and the guard closed it once;
- exactly one terminal transition recorded (or the row is ``interrupted``), never ``in_progress``;
- never ``completed`` after a client cancel that arrived before the terminal;
- the stored status equals ``GET /responses/{id}``;
- every forwarded event is stored exactly once (directly, or through ``replay_spool``), in order.

CI runs a sample of positions; ``EVENTGUARD_SLOW=1`` (``scripts/reliability.sh slow``) runs all 31.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event as sa_event

from eventguard import SqlSink
from eventguard.store import ResponseStore
from eventguard.testing import ScriptedChatClient, chat_agent, trigger_shutdown
from tests.upstream._drivers import AsgiCall, asgi_post_with_disconnect, client_for, create, get_status

from . import _host
from ._common import SLOW, Db, database, kill_pg_connections, report
from ._host import EVENTS, event_type, poll

pytestmark = pytest.mark.upstream

CASE_BOUND = 30.0  # seconds: one case, end to end
SAMPLE = (0, 1, 2, 4, 13, 27, 28, 29, 30)  # created, in_progress, first item, mid-text, the end
POSITIONS = tuple(range(EVENTS + 1)) if SLOW else SAMPLE
TERMINAL_AT = EVENTS - 1  # index of response.completed in the inner stream
TERMINALS = {"response.completed", "response.incomplete", "response.failed"}

FAULTS = [
    "client_cancel",  # POST /responses/{id}/cancel on a background stream
    "client_disconnect",  # a foreground stream's client goes away (raw ASGI http.disconnect)
    "shutdown_request",  # server.request_shutdown(), the SIGTERM pre-shutdown path (foreground)
    "shutdown_endpoint",  # the responses layer's handle_shutdown() (background)
    "steering_signal",  # the host's signal set with no cause flag (what steering does)
    "executor_raises",  # the inner stream raises
    "executor_hangs",  # a client cancel, then the inner ignores the signal past cancel_grace
    "consumer_cancelled",  # the task consuming the guard is cancelled
    "db_outage",  # SQLite: another connection holds an exclusive lock; PostgreSQL: backends killed
    "disk_full",  # SQLite: PRAGMA max_page_count pinned to the current size
]


class Injected(RuntimeError):
    pass


class Outage:
    """A database fault that starts inside the stream and ends when the test says so."""

    def __init__(self, db: Db, sink: SqlSink) -> None:
        self.db = db
        self.sink = sink
        self.full = False
        self._lock_conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def install_disk_full(self) -> None:
        outage = self

        @sa_event.listens_for(self.sink.engine.sync_engine, "checkout")
        def _pin(dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
            cur = dbapi_conn.cursor()
            try:
                if outage.full:
                    cur.execute("PRAGMA page_count")
                    pages = cur.fetchone()[0]
                    cur.execute(f"PRAGMA max_page_count = {int(pages)}")
                else:
                    cur.execute("PRAGMA max_page_count = 1073741823")
            finally:
                cur.close()

    async def start(self, fault: str) -> None:
        if fault == "disk_full":
            self.full = True
            return
        if self.db.kind == "postgres":
            await kill_pg_connections(self.sink.owner)
            return
        assert self.db.path is not None

        def lock() -> None:
            conn = sqlite3.connect(self.db.path, timeout=10, isolation_level=None, check_same_thread=False)
            conn.execute("BEGIN EXCLUSIVE")
            self._lock_conn = conn

        async with asyncio.timeout(15):
            await asyncio.to_thread(lock)

    def end(self) -> None:
        self.full = False
        if self._lock_conn is not None:
            self._lock_conn.execute("ROLLBACK")
            self._lock_conn.close()
            self._lock_conn = None


def make_fault(name: str, server: Any, outage: Outage) -> Any:
    async def pause(context: Any, signal: Any) -> None:
        server.reached.set()
        async with asyncio.timeout(CASE_BOUND):
            while not (signal.is_set() or server.proceed.is_set()):  # noqa: ASYNC110
                await asyncio.sleep(0.005)

    async def fault(context: Any, signal: Any) -> None:
        if name in ("client_cancel", "client_disconnect", "shutdown_request", "shutdown_endpoint"):
            await pause(context, signal)
        elif name == "executor_hangs":
            await pause(context, signal)
            if signal.is_set():
                await asyncio.sleep(3600)  # ignores the signal; only the guard's watchdog ends this
        elif name == "steering_signal":
            signal.set()
        elif name == "executor_raises":
            raise Injected("injected by the fault matrix")
        elif name == "consumer_cancelled":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        elif name in ("db_outage", "disk_full"):
            await outage.start(name)

    return fault


MODE = {
    "client_disconnect": "fg_asgi",
    "shutdown_request": "fg_stream",
}


async def run_case(db: Db, fault: str, p: int, tmp: Path) -> list[str]:
    """One case; returns the violations found (an empty list when every property holds)."""
    sink = SqlSink(
        db.url,
        schema=db.schema,
        spool_path=db.spool,
        busy_timeout=0.2,
        flush_interval=0.01,
        close_timeout=3.0,
    )
    await sink.start()
    outage = Outage(db, sink)
    if fault == "disk_full":
        outage.install_disk_full()
    agent, _ = chat_agent(ScriptedChatClient(tuple(f"c{i} " for i in range(_host.CHUNKS))))
    server = _host.build(agent, sink)
    server.fault_at = p
    server.fault = make_fault(fault, server, outage)
    mode = MODE.get(fault, "bg_stream")
    violations: list[str] = []
    cancel_status: int | None = None
    try:
        async with client_for(server) as client:
            call = AsgiCall()
            if mode == "fg_asgi":
                body = {"input": "go", "stream": True, "store": True, "background": False}
                post: asyncio.Task[Any] = asyncio.create_task(
                    asgi_post_with_disconnect(server, "/responses", body, call)
                )
            else:
                post = asyncio.create_task(
                    create(client, background=mode == "bg_stream", stream=True, store=True)
                )
            needs_driver = fault in (
                "client_cancel",
                "client_disconnect",
                "shutdown_request",
                "shutdown_endpoint",
                "executor_hangs",
            )
            side: asyncio.Task[Any] | None = None
            if needs_driver:
                await poll(lambda: server.reached.is_set() or server.done.is_set(), CASE_BOUND)
                if server.reached.is_set():
                    rid = server.response_id
                    if fault in ("client_cancel", "executor_hangs"):
                        cancelled = await client.post(f"/responses/{rid}/cancel")
                        cancel_status = cancelled.status_code
                    elif fault == "client_disconnect":
                        call.disconnect.set()
                        await poll(lambda: server.signal.is_set(), 2.0)
                    elif fault == "shutdown_request":
                        await trigger_shutdown(server, "request")
                        await poll(lambda: server.signal.is_set(), 2.0)
                    else:
                        side = asyncio.create_task(trigger_shutdown(server, "endpoint"))
                        await poll(lambda: server.signal.is_set(), 2.0)
                server.proceed.set()
            await server.done.wait()
            try:
                await post
            except BaseException as exc:  # a raw-ASGI call may end with the host's own error
                if isinstance(exc, TimeoutError):
                    raise
            if side is not None:
                await side
            rid = server.response_id
            g = server.guard_for(rid)
            assert g is not None, "no guard for the response"
            # The stuck inner is closed in the background: give it the grace it needs.
            await poll(lambda: server.finalised >= 1 and g.inner_closed >= 1, 5.0)
            await poll(lambda: g.lifecycle.ended, 5.0)
            got = None
            for _ in range(200):  # the host may still be writing its own ending
                got = await get_status(client, rid)
                if got in ("completed", "incomplete", "failed", "cancelled"):
                    break
                await asyncio.sleep(0.02)
        outage.end()
        await sink.flush()
        spooled = sink.stats.batches_spooled
        if sink.spool.pending():
            await sink.replay_spool()
        forwarded = list(server.forwarded)
        lc = g.lifecycle

        async with ResponseStore(db.url, schema=db.schema) as store:
            hist = await store.history(rid)

        def check(ok: bool, what: str, bucket: list[str] | None = None) -> None:
            if not ok:
                (violations if bucket is None else bucket).append(f"{db.kind} {fault}@{p}: {what}")

        known: list[str] = []
        host: list[str] = []

        check(server.finalised == 1, f"inner finalised {server.finalised} times")
        check(g.inner_closed == 1, f"guard closed the inner {g.inner_closed} times")
        check(hist is not None, "no stored row")
        if hist is None:
            return violations
        row = hist.response
        transitions = [t for a in hist.attempts for t in a.transitions]
        terminal_steps = [
            t for t in transitions if t.to_state in ("completed", "incomplete", "failed", "cancelled")
        ]
        if row.status == "interrupted":
            check(not terminal_steps, f"interrupted with terminal transitions {terminal_steps}")
        else:
            check(
                len(terminal_steps) == 1, f"{len(terminal_steps)} terminal transitions, status {row.status}"
            )
        check(row.status == lc.state.value, f"stored {row.status} but the guard says {lc.state.value}")
        created = any(event_type(e) == "response.created" for e in forwarded)
        if got is None:
            # The host never created the response (the fault came before response.created): it has
            # nothing to report, the database keeps the failed/cancelled attempt.
            check(not created and row.status in ("failed", "cancelled"), f"stored {row.status}, GET 404")
        elif fault == "consumer_cancelled" and got == "in_progress":
            # HOST: its task was cancelled (after the terminal, any release; at any point on the oldest
            # release): the host never finalises its record, the database holds the guard's ending.
            check(False, f"stored {row.status}, host stays in_progress", host)
        else:
            check(row.status == got, f"stored {row.status} but GET says {got}")
        cancel_before_terminal = server.client_cancelled and p <= TERMINAL_AT
        if cancel_before_terminal:
            check(row.status != "completed", "completed after a client cancel")
            check(
                not any(event_type(e) == "response.completed" for e in forwarded),
                "a response.completed forwarded after a client cancel",
            )
        stored = [e for a in hist.attempts for e in a.events]
        expected = forwarded
        check(
            [e.seq for e in stored] == list(range(len(expected))),
            f"stored seqs {[e.seq for e in stored]} for {len(forwarded)} forwarded events",
        )
        check(
            [e.type for e in stored] == [event_type(e) for e in expected],
            "stored event types differ from the forwarded ones",
        )
        check(row.event_count == len(forwarded), f"event_count {row.event_count} != {len(forwarded)}")
        check(len([e for e in forwarded if event_type(e) in TERMINALS]) <= 1, "two terminals forwarded")
        check(not sink.spool.pending(), "the spool still holds batches after replay")
        CASES.append(
            {
                "db": db.kind,
                "fault": fault,
                "p": p,
                "status": row.status,
                "get": got,
                "spooled": spooled,
                "cancel": cancel_status,
                "known": known,
                "host": host,
            }
        )
    finally:
        outage.end()
        await sink.aclose()
    return violations


CASES: list[dict[str, Any]] = []


def _params() -> list[Any]:
    out = []
    for db in ("sqlite", "postgres"):
        for fault in FAULTS:
            if fault == "disk_full" and db == "postgres":
                continue
            marks = [pytest.mark.postgres] if db == "postgres" else []
            out.append(pytest.param(db, fault, id=f"{db}-{fault}", marks=marks))
    return out


@pytest.mark.parametrize(("db_kind", "fault"), _params())
async def test_fault_matrix(db_kind: str, fault: str, tmp_path: Path) -> None:
    violations: list[str] = []
    before = len(CASES)
    async with database(db_kind, tmp_path) as db:
        for p in POSITIONS:
            async with asyncio.timeout(CASE_BOUND):  # no hang: a TimeoutError fails the test
                violations += await run_case(db, fault, p, tmp_path)
    ran = CASES[before:]
    effective = sum(1 for c in ran if c["spooled"]) if fault in ("db_outage", "disk_full") else len(ran)
    report(
        "fault_matrix",
        db=db_kind,
        fault=fault,
        cases=len(POSITIONS),
        violations=len(violations),
        spooled_cases=effective if fault in ("db_outage", "disk_full") else None,
        known_bug_hits=sum(len(c["known"]) for c in ran),
        host_divergences=sum(len(c["host"]) for c in ran),
        statuses=sorted({f"{c['status']}" for c in ran}),
    )
    assert not violations, "\n".join(violations)
