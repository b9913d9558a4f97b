"""The SIGTERM fault: a real server process receives SIGTERM while a response streams.

The child (``_sigterm_child``) runs the guarded server with ``server.run()``, as production does
(Hypercorn, the host's own SIGTERM handler; a graceful drain of 3 s), with a sink on SQLite or
PostgreSQL. A streaming response, foreground or background, is started over loopback; when the inner
stream reaches position ``p`` of its 30 events the process gets SIGTERM. The host tells foreground runs
(their context's ``shutdown``); it does not tell background ones, which the exit cancels. Each case
checks what the fault matrix checks, across the process boundary:

- no hang: the client's stream ends and the process exits, both bounded; the exit code is 0;
- the inner stream was finalised once and the guard closed it once;
- one terminal transition recorded, or the row is ``interrupted``; never ``completed`` when the signal
  came before the terminal, and then the recorded cause is the shutdown; never ``cancelled`` (no client
  cancelled);
- the stored status equals the terminal the client received (the process, and with it
  ``GET /responses/{id}``, is gone once the check can run; the client's terminal is what GET said);
- every forwarded event stored exactly once, in order (directly, or through spool replay).

CI runs three positions per database and mode; ``EVENTGUARD_SLOW=1`` runs every third position.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventguard import SqlSink
from eventguard.store import ResponseStore

from ._common import SLOW, Db, database, report
from ._host import EVENTS

pytestmark = pytest.mark.upstream

ROOT = Path(__file__).resolve().parents[2]
CASE_BOUND = 60.0  # seconds: one case, process start to exit
POSITIONS = tuple(range(0, EVENTS + 1, 3)) if SLOW else (2, 13, 27)
TERMINAL_AT = EVENTS - 1
TERMINAL_TYPES = {"response.completed", "response.incomplete", "response.failed"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def read_line(proc: asyncio.subprocess.Process, prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode(errors="replace")
        if not line:
            raise AssertionError(f"the child ended before printing {prefix}")
        # The injected pause waits for the signal; SIGTERM or the exit must end that wait.
        assert not line.startswith("NOSIGNAL"), "the run was never told, nor cancelled, within 20 s"
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


async def ready(port: int, proc: asyncio.subprocess.Process, stderr: Path) -> None:
    async with httpx.AsyncClient() as client:
        while True:
            if proc.returncode is not None:  # it died (a port taken meanwhile, say): say why
                why = (await asyncio.to_thread(stderr.read_text))[-2000:]
                raise AssertionError(f"the server exited with {proc.returncode}: {why}")
            try:
                if (await client.get(f"http://127.0.0.1:{port}/readiness")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)


async def stream_types(port: int, seen: list[dict[str, Any]], background: bool) -> None:
    body = {"input": "go", "stream": True, "store": True, "background": background}
    async with httpx.AsyncClient(timeout=CASE_BOUND) as client:  # noqa: SIM117
        async with client.stream("POST", f"http://127.0.0.1:{port}/responses", json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            try:
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        seen.append(json.loads(line[5:]))
            except httpx.TransportError:
                pass  # the server went away mid-stream (cut, reset): what was seen is kept


async def run_case(db: Db, p: int, background: bool = False) -> list[str]:
    port = free_port()
    stderr = db.spool.with_name(f"sigterm-{p}-{background}.stderr")
    errors = stderr.open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.reliability._sigterm_child",
        db.url,
        db.schema or "-",
        str(db.spool),
        str(port),
        str(p),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=errors,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "AGENTSERVER_GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS": "3"},
    )
    seen: list[dict[str, Any]] = []
    tasks: list[asyncio.Task[Any]] = []
    try:
        await ready(port, proc, stderr)
        client = asyncio.create_task(stream_types(port, seen, background))
        reached = asyncio.create_task(read_line(proc, "REACHED "))
        tasks += [client, reached]
        await asyncio.wait({client, reached}, return_when=asyncio.FIRST_COMPLETED)
        if client.done() and not reached.done():
            client.result()  # the POST itself failed: show that, not a wait for REACHED
        signalled_before_end = reached.done() and not client.done()
        rid = await reached
        proc.send_signal(signal.SIGTERM)
        await client
        done = json.loads(await read_line(proc, "DONE "))
        code = await proc.wait()
    finally:
        for task in tasks:
            task.cancel()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        errors.close()

    violations: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            violations.append(f"{db.kind} sigterm@{p}: {what}")

    check(code == 0, f"the server exited with {code}")
    check(done["finalised"] == 1, f"inner finalised {done['finalised']} times")
    check(done["inner_closed"] == 1, f"guard closed the inner {done['inner_closed']} times")
    sink = SqlSink(db.url, schema=db.schema, spool_path=db.spool)
    try:
        if sink.spool.pending():
            await sink.replay_spool()
        check(not sink.spool.pending(), "the spool still holds batches after replay")
    finally:
        await sink.aclose()
    async with ResponseStore(db.url, schema=db.schema) as store:
        hist = await store.history(rid)
    check(hist is not None, "no stored row")
    if hist is None:
        return violations
    row = hist.response
    steps = [t for a in hist.attempts for t in a.transitions]
    terminal_steps = [t for t in steps if t.to_state in ("completed", "incomplete", "failed", "cancelled")]
    if row.status == "interrupted":
        check(not terminal_steps, f"interrupted with terminal transitions {terminal_steps}")
    else:
        check(len(terminal_steps) == 1, f"{len(terminal_steps)} terminal transitions, status {row.status}")
    check(row.status == done["state"], f"stored {row.status} but the guard says {done['state']}")
    if signalled_before_end and p <= TERMINAL_AT:
        check(row.status != "completed", "completed after SIGTERM cut the run short")
        check(row.cause == "shutdown", f"ended {row.status} by {row.cause}, not by the shutdown")
    client_terminal = [e for e in seen if e.get("type") in TERMINAL_TYPES]
    if client_terminal:
        said = client_terminal[-1].get("response", {}).get("status")
        check(row.status == said, f"stored {row.status} but the client was told {said}")
    stored = [e for a in hist.attempts for e in a.events]
    check(
        [e.seq for e in stored] == list(range(len(done["forwarded"]))),
        f"stored seqs {[e.seq for e in stored]} for {len(done['forwarded'])} forwarded events",
    )
    check([e.type for e in stored] == done["forwarded"], "stored event types differ from the forwarded ones")
    check(row.status != "cancelled", "cancelled, though no client cancelled")
    CASES.append({"db": db.kind, "p": p, "bg": background, "status": row.status, "spooled": done["spooled"]})
    return violations


CASES: list[dict[str, Any]] = []


@pytest.mark.parametrize(
    "db_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], ids=["sqlite", "postgres"]
)
async def test_sigterm(db_kind: str, tmp_path: Path) -> None:
    violations: list[str] = []
    before = len(CASES)
    async with database(db_kind, tmp_path) as db:
        for p in POSITIONS:
            for background in (False, True):
                async with asyncio.timeout(CASE_BOUND):  # no hang: a TimeoutError fails the test
                    violations += await run_case(db, p, background)
    ran = CASES[before:]
    report(
        "fault_matrix",
        db=db_kind,
        fault="sigterm",
        cases=len(ran),
        violations=len(violations),
        spooled_cases=None,
        known_bug_hits=0,
        host_divergences=0,
        statuses=sorted({c["status"] for c in ran}),
    )
    assert not violations, "\n".join(violations)
