"""Crash recovery: a child streams into SQLite and is SIGKILLed at a random moment.

After each kill: the file opens and passes ``PRAGMA integrity_check``; no half-written terminal (a
terminal row has its end time and exactly one terminal transition, and vice versa); every event the
child saw flushed is there, with no gap; ``ResponseStore.recover()`` (and ``eventguard recover``)
mark what was left in progress, idempotently; a recovered re-entry continues as attempt 2.

CI runs a handful of kills; ``EVENTGUARD_SLOW=1`` runs 50.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from eventguard import SqlSink, guard
from eventguard.lifecycle import ResponseInfo
from eventguard.store import ResponseStore

from ._common import SLOW, report

ROOT = Path(__file__).resolve().parents[2]
KILLS = 50 if SLOW else 4
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


async def read_until(proc: asyncio.subprocess.Process, marker: bytes, within: float) -> list[bytes]:
    lines: list[bytes] = []
    assert proc.stdout is not None
    async with asyncio.timeout(within):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise AssertionError(f"child ended early: {b''.join(lines)[-2000:]!r}")
            lines.append(line)
            if line.startswith(marker):
                return lines


async def kill_child(url: str, spool: Path, seed: int, rng: random.Random) -> dict[str, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.reliability._crash_child",
        url,
        str(spool),
        str(seed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await read_until(proc, b"READY", 60)
        await asyncio.sleep(rng.uniform(0.05, 1.5))
    finally:
        proc.send_signal(signal.SIGKILL)
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            rest = await proc.stdout.read()
            await proc.wait()
    flushed: dict[str, int] = {}
    for line in rest.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "F":
            flushed[parts[1]] = max(flushed.get(parts[1], 0), int(parts[2]))
    return flushed


def check_file(path: Path, flushed: dict[str, int]) -> dict[str, Any]:
    conn = sqlite3.connect(path, timeout=10)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = dict(conn.execute("SELECT response_id, status FROM eventguard_responses").fetchall())
        finished = conn.execute(
            "SELECT count(*) FROM eventguard_responses WHERE status IN (?,?,?,?) AND finished_at IS NULL",
            TERMINAL,
        ).fetchone()[0]
        assert finished == 0, "a terminal row without its end time"
        terminal_steps: dict[str, int] = {}
        for rid, n in conn.execute(
            "SELECT response_id, count(*) FROM eventguard_transitions WHERE to_state IN (?,?,?,?) "
            "GROUP BY response_id",
            TERMINAL,
        ):
            terminal_steps[rid] = n
        for rid, status in rows.items():
            want = 1 if status in TERMINAL else 0
            assert terminal_steps.get(rid, 0) == want, (rid, status, terminal_steps.get(rid))
        for rid, n in flushed.items():
            seqs = [
                s
                for (s,) in conn.execute(
                    "SELECT seq FROM eventguard_events WHERE response_id = ? AND attempt = 1 ORDER BY seq",
                    (rid,),
                )
            ]
            assert seqs[:n] == list(range(n)), (rid, n, seqs[:n])
        for (payload,) in conn.execute("SELECT payload FROM eventguard_events"):
            json.loads(payload)  # every stored payload is whole JSON
        in_progress = [rid for rid, s in rows.items() if s not in (*TERMINAL, "interrupted")]
        return {"rows": len(rows), "in_progress": len(in_progress), "flushed": sum(flushed.values())}
    finally:
        conn.close()


def cli_recover(url: str) -> list[str]:
    exe = Path(sys.executable).with_name("eventguard")
    out = subprocess.run(
        [str(exe), "recover", "--older-than", "0m", "--database-url", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(out.stdout)["marked"])


async def test_sigkill_loop(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("EVENTGUARD_CRASH_SEED", "6")))
    totals = {"kills": 0, "rows": 0, "left_in_progress": 0, "flushed_events_checked": 0, "recovered": 0}
    use_cli = Path(sys.executable).with_name("eventguard").exists()
    for k in range(KILLS):
        db = tmp_path / f"crash-{k}.db"
        url = f"sqlite+aiosqlite:///{db}"
        spool = tmp_path / f"crash-{k}.spool.jsonl"
        flushed = await kill_child(url, spool, 1000 + k, rng)
        if not db.exists():
            continue
        seen = check_file(db, flushed)
        totals["kills"] += 1
        totals["rows"] += seen["rows"]
        totals["left_in_progress"] += seen["in_progress"]
        totals["flushed_events_checked"] += seen["flushed"]

        # Leftover spool (none expected without an outage) replays cleanly.
        if spool.exists():
            async with SqlSink(url, spool_path=spool) as sink:
                async with asyncio.timeout(60):
                    await sink.replay_spool()

        # recover(): every row left in progress is marked, once; ended rows are untouched.
        if use_cli and k % 2 == 1:
            marked = cli_recover(url)
            again = cli_recover(url)
        else:
            async with ResponseStore(url) as store, asyncio.timeout(60):
                marked = await store.recover(older_than=timedelta(0))
                again = await store.recover(older_than=timedelta(0))
        assert len(marked) == seen["in_progress"]
        assert again == []
        totals["recovered"] += len(marked)
        after = check_file(db, {})
        assert after["in_progress"] == 0

        # A recovered re-entry of an interrupted response continues as a new attempt.
        if marked:
            await reenter(url, tmp_path / f"reenter-{k}.spool.jsonl", marked[0])
    report("crash_recovery", **totals)
    assert totals["kills"] >= KILLS - 1


async def reenter(url: str, spool: Path, rid: str) -> None:
    events = [
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.output_text.delta", "delta": "again"},
        {"type": "response.completed", "response": {"id": rid, "status": "completed"}},
    ]

    async def inner() -> Any:
        for ev in events:
            await asyncio.sleep(0)
            yield ev

    async with asyncio.timeout(60):
        async with SqlSink(url, spool_path=spool) as sink:
            info = ResponseInfo(response_id=rid, is_recovery=True, background=True, store=True)
            async with guard(inner(), asyncio.Event(), sink=sink, info=info) as g:
                out = [ev async for ev in g]
            assert g.lifecycle.attempt == 2
        async with ResponseStore(url) as store:
            hist = await store.history(rid)
    assert hist is not None
    assert len(out) == 4
    assert hist.response.status == "completed"
    assert hist.response.attempt == 2
    second = next(a for a in hist.attempts if a.attempt == 2)
    assert [e.seq for e in second.events] == [0, 1, 2, 3]
    first = next(a for a in hist.attempts if a.attempt == 1)
    assert [e.seq for e in first.events] == list(range(len(first.events)))


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
