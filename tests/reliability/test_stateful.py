"""Hypothesis stateful test of the guard and the SQL sink together (sync rules driving an event loop).

Each rule is one thing the world does to a response: the inner stream yields a delta, a lifecycle
event or a terminal, ends, raises; the client cancels; shutdown; the consumer closes the guard. The
sink writes to the spool only (the database is "away"), then the spool is replayed twice.
Invariants: at most one terminal (forwarded and recorded), never completed after a client cancel,
stored history equal to the forwarded events, replay idempotent.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from eventguard import Guard, SqlSink, State, guard
from eventguard.store import ResponseStore

from ._common import SLOW, report

TERMINALS = {"response.completed", "response.incomplete", "response.failed"}
STEP = 10.0
_DB_DIR = Path(tempfile.mkdtemp(prefix="eg-stateful-"))
_DB_URL = f"sqlite+aiosqlite:///{_DB_DIR / 'stateful.db'}"
STATS = {"examples": 0, "steps": 0, "replays": 0}


class Inner:
    """An inner stream that does exactly what the rules tell it, one command at a time."""

    def __init__(self) -> None:
        self.commands: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.waiting = False
        self.closed = 0

    async def gen(self) -> AsyncIterator[Any]:
        try:
            while True:
                self.waiting = True
                cmd, arg = await self.commands.get()
                self.waiting = False
                if cmd == "end":
                    return
                if cmd == "raise":
                    raise RuntimeError("inner raised")
                yield arg
        finally:
            self.closed += 1


class GuardMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.spool = _DB_DIR / f"{self.rid}.spool.jsonl"
        self.inner = Inner()
        self.ctx = SimpleNamespace(client_cancelled=False, shutdown=asyncio.Event(), response_id=self.rid)
        self.signal = asyncio.Event()
        self.sink = self.run(self._sink())
        self.g = self.run(self._guard())  # built inside the loop that iterates it, as the README asks
        self.forwarded: list[Any] = []
        self.pending: asyncio.Task[Any] | None = None
        self.done = False
        self.raised: BaseException | None = None
        self.cancel_before_terminal = False
        self.created = False
        STATS["examples"] += 1

    async def _sink(self) -> SqlSink:
        sink = SqlSink(_DB_URL, spool_path=self.spool, flush_interval=0.001)
        await sink.start()
        # The database is away: every batch goes to the spool.
        sink.writer.outage.retry_at = time.monotonic() + 3600
        return sink

    async def _guard(self) -> Guard:
        return guard(self.inner.gen(), self.signal, context=self.ctx, sink=self.sink, cancel_grace=None)

    def run(self, aw: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(STEP):
                return await aw

        return self.loop.run_until_complete(bounded())

    def step(self, cmd: str, arg: Any = None) -> None:
        """Hand the inner one command and let the guard settle (forward, drop, or end)."""
        STATS["steps"] += 1
        if self.pending is None:
            self.pending = self.loop.create_task(self.g.__anext__())
        if cmd:
            self.inner.commands.put_nowait((cmd, arg))

        async def settle() -> None:
            while True:
                await asyncio.sleep(0)
                if self.pending is not None and self.pending.done():
                    return
                if self.inner.waiting and self.inner.commands.empty():
                    await asyncio.sleep(0)
                    if self.inner.waiting and self.inner.commands.empty():
                        return

        self.run(settle())
        task = self.pending
        if task is not None and task.done():
            self.pending = None
            exc = task.exception()
            if exc is None:
                self.forwarded.append(task.result())
            elif isinstance(exc, StopAsyncIteration):
                self.done = True
            else:
                self.raised = exc
                self.done = True

    def rtype(self, status: str) -> dict[str, Any]:
        etype = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            status, "response.failed"
        )
        resp: dict[str, Any] = {"id": self.rid, "status": status}
        if status == "failed":
            resp["error"] = {"code": "server_error", "message": "x"}
        return {"type": etype, "response": resp}

    # -- rules -------------------------------------------------------------------------------------
    @precondition(lambda self: not self.done)
    @rule()
    def created_event(self) -> None:
        self.created = True
        self.step(
            "yield", {"type": "response.created", "response": {"id": self.rid, "status": "in_progress"}}
        )

    @precondition(lambda self: not self.done)
    @rule(text=st.text(max_size=20))
    def delta(self, text: str) -> None:
        self.step("yield", {"type": "response.output_text.delta", "delta": text})

    @precondition(lambda self: not self.done)
    @rule(status=st.sampled_from(["completed", "incomplete", "failed", "cancelled"]))
    def terminal(self, status: str) -> None:
        if self.ctx.client_cancelled and not any(_t(e) in TERMINALS for e in self.forwarded):
            self.cancel_before_terminal = True
        self.step("yield", self.rtype(status))

    @precondition(lambda self: not self.done)
    @rule()
    def client_cancel(self) -> None:
        if not any(_t(e) in TERMINALS for e in self.forwarded):
            self.cancel_before_terminal = True
        self.ctx.client_cancelled = True
        self.signal.set()

    @precondition(lambda self: not self.done)
    @rule()
    def shutdown(self) -> None:
        self.ctx.shutdown.set()
        self.signal.set()

    @precondition(lambda self: not self.done)
    @rule()
    def steering(self) -> None:
        self.signal.set()

    @precondition(lambda self: not self.done)
    @rule()
    def inner_ends(self) -> None:
        self.step("end")

    @precondition(lambda self: not self.done)
    @rule()
    def inner_raises(self) -> None:
        self.step("raise")

    @precondition(lambda self: not self.done)
    @rule()
    def consumer_closes(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.run(asyncio.wait({self.pending}))
            self.pending = None
        self.run(self.g.aclose())
        self.done = True

    @rule()
    def tick(self) -> None:
        self.run(asyncio.sleep(0.001))  # time passes; the sink's writer may run

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def one_terminal(self) -> None:
        forwarded = [e for e in self.forwarded if _t(e) in TERMINALS]
        assert len(forwarded) <= 1
        if forwarded:
            assert _t(self.forwarded[-1]) in TERMINALS
        lc = self.g.lifecycle
        assert sum(1 for t in lc.transitions if t.to_state in _TERMINAL_STATES) <= 1

    @invariant()
    def never_completed_after_cancel(self) -> None:
        if self.cancel_before_terminal:
            assert self.g.lifecycle.state is not State.COMPLETED
            assert not any(_t(e) == "response.completed" for e in self.forwarded)

    def teardown(self) -> None:
        try:
            if not self.done:
                self.consumer_closes()
            assert self.inner.closed == 1 or self.pending is None
            self.run(self.sink.flush())
            self.run(self.sink.aclose())
            lc = self.g.lifecycle
            assert lc.ended
            assert self.raised is None or isinstance(self.raised, RuntimeError)
            if lc.info.response_id is None:
                return  # never named: stored under a generated id, nothing to compare by id
            snapshot = self.spool.read_bytes() if self.spool.exists() else b""
            first = self.run(self._replay_and_read())
            if snapshot:
                self.spool.write_bytes(snapshot)  # the same spool again: replay must change nothing
            second = self.run(self._replay_and_read())
            STATS["replays"] += 2
            assert first == second
            status, stored = first
            expected = [_t(e) for e in self.forwarded]
            assert stored == expected
            assert status == lc.state.value
        finally:
            self.loop.close()
            shutil.rmtree(self.spool, ignore_errors=True)

    async def _replay_and_read(self) -> tuple[str, list[str | None]]:
        sink = SqlSink(_DB_URL, spool_path=self.spool)
        try:
            await sink.replay_spool()
        finally:
            await sink.aclose()
        async with ResponseStore(_DB_URL) as store:
            hist = await store.history(self.rid)
        assert hist is not None
        return hist.response.status, [e.type for a in hist.attempts for e in a.events]


_TERMINAL_STATES = {State.COMPLETED, State.INCOMPLETE, State.FAILED, State.CANCELLED}


def _t(event: object) -> str | None:
    return event.get("type") if isinstance(event, dict) else None


def test_guard_and_sink_state_machine() -> None:
    run_state_machine_as_test(
        GuardMachine,
        settings=settings(
            max_examples=300 if SLOW else 60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    report("stateful", **STATS)
