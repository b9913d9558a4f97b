"""Replaying one spool from several processes at once: each file is claimed by one of them.

Real processes (``subprocess``), real files, real ``flock``: a record is handed out by exactly one
replay, counts add up to the total, a file left by a dead replay is taken up again, and an append
racing a replay lands in a file that will be replayed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from eventguard.sink.batch import Batch
from eventguard.sink.spool import Spool, encode_entry

from .test_spool_format import make_batch

ROOT = Path(os.path.abspath(__file__)).parents[2]  # this checkout (not resolving symlinks)
TIMEOUT = 120

# A replaying process: waits for the start file, replays every file it can claim (holding each
# for ``hold`` seconds per record, as a database write would), prints what it got.
REPLAYER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from eventguard.sink.spool import BadEntry, Spool

    spool, go, hold = Spool(Path(sys.argv[1])), Path(sys.argv[2]), float(sys.argv[3])
    Path(sys.argv[4]).touch()  # ready
    while not go.exists():
        time.sleep(0.001)
    ids, bad, files = [], 0, 0
    for file in spool.take():
        files += 1
        for record in file.entries():
            if isinstance(record, BadEntry):
                bad += 1
            else:
                ids.append(record.response_id)
            time.sleep(hold)
        spool.done(file)
    print(json.dumps({"ids": ids, "bad": bad, "files": files}))
    """
)

# Claims the first file it can, says so, then waits to be killed.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eventguard.sink.spool import Spool

    spool = Spool(Path(sys.argv[1]))
    files = spool.take()
    held = next(files)
    print(held.path.name, flush=True)
    time.sleep(600)
    """
)

# Appends ``n`` batches, one append each, as fast as it can.
APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from eventguard.sink.spool import Spool
    sys.path.insert(0, sys.argv[3])
    from sink.test_spool_format import make_batch

    spool = Spool(Path(sys.argv[1]))
    for i in range(int(sys.argv[2])):
        spool.append([make_batch(f"resp_{i}", n_events=1)])
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _python(code: str, *args: object, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return out


def _fill(spool: Spool, files: int, per_file: int) -> list[str]:
    """``files`` spool files: ``files - 1`` set aside by earlier, stopped replays, and the live one."""
    ids: list[str] = []
    for f in range(files):
        batches = [make_batch(f"resp_{f}_{i}", n_events=2) for i in range(per_file)]
        ids += [b.response_id for b in batches]
        spool.append(batches)
        if f < files - 1:
            for file in spool.take():  # set aside, then kept: a replay stopped by an outage
                spool.release(file)
    return ids


def _replay_here(spool: Spool) -> list[str]:
    ids: list[str] = []
    for file in spool.take():
        for record in file.entries():
            assert isinstance(record, Batch), record
            ids.append(record.response_id)
        spool.done(file)
    return ids


@pytest.mark.parametrize("files", [1, 7])
def test_two_processes_replaying_at_once_each_take_every_entry_once(tmp_path: Path, files: int) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    ids = _fill(spool, files, per_file=20)
    go = tmp_path / "go"
    procs = [
        _python(REPLAYER, spool.path, go, 0.003, tmp_path / f"ready-{n}", cwd=tmp_path) for n in range(2)
    ]
    deadline = time.monotonic() + TIMEOUT
    while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.005)
    go.touch()
    results = [json.loads(_finish(p)) for p in procs]
    got = [rid for r in results for rid in r["ids"]]
    assert sorted(got) == sorted(ids), "every record replayed exactly once"
    assert sum(len(r["ids"]) for r in results) == len(ids)
    assert sum(r["files"] for r in results) == files
    assert sum(r["bad"] for r in results) == 0
    assert not spool.pending()


def test_a_file_held_by_a_live_replay_is_skipped_and_taken_up_when_it_dies(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    ids = _fill(spool, 1, per_file=5)
    holder = _python(HOLDER, spool.path, cwd=tmp_path)
    try:
        assert holder.stdout is not None
        name = holder.stdout.readline().strip()
        assert name.startswith("spool.jsonl.replaying-"), holder.stderr.read() if holder.stderr else ""
        # Held by a live process: skipped, and still pending.
        assert _replay_here(spool) == []
        assert spool.pending() and spool.size_bytes() > 0
        # Appends meanwhile go to a new live file, which this replay takes.
        spool.append([make_batch("resp_new")])
        assert _replay_here(spool) == ["resp_new"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=TIMEOUT)
    # The holder died with its claim: its file (still ".replaying-") is claimable again.
    assert (tmp_path / name).exists()
    assert _replay_here(spool) == ids
    assert not spool.pending()


def test_appends_racing_replays_land_exactly_once(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    n = 400
    appender = _python(APPENDER, spool.path, n, ROOT / "tests", cwd=tmp_path)
    got: list[str] = []
    rounds = 0
    while appender.poll() is None:
        got += _replay_here(spool)
        rounds += 1
    _finish(appender)
    got += _replay_here(spool)
    assert sorted(got) == sorted(f"resp_{i}" for i in range(n)), f"{rounds} replays"
    assert not spool.pending()


def test_two_cli_replays_at_once_report_counts_that_add_up(tmp_path: Path) -> None:
    import asyncio

    from sqlalchemy import func, select

    from eventguard.sink import SqlSink
    from eventguard.sql.tables import events, responses

    url = f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}"
    spool = Spool(tmp_path / "spool.jsonl")
    files, per_file = 8, 60
    ids = _fill(spool, files, per_file)

    async def migrate() -> None:
        async with SqlSink(url, spool_path=tmp_path / "other.jsonl") as sink:
            await sink.migrate()

    asyncio.run(migrate())
    cli = "from eventguard.cli import main; main()"
    argv = ["spool", "replay", "--spool", spool.path, "--database-url", url, "--json"]
    procs = [_python(cli, *argv, cwd=tmp_path) for _ in range(2)]
    results = [json.loads(_finish(p)) for p in procs]
    assert sum(r["files"] for r in results) == files
    assert sum(r["batches"] for r in results) == len(ids)
    assert sum(r["events"] for r in results) == 2 * len(ids)
    assert not spool.pending()

    async def stored() -> tuple[int, int]:
        async with SqlSink(url, spool_path=tmp_path / "other.jsonl") as sink, sink.engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(responses))).scalar_one()
            evs = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        return rows, evs

    assert asyncio.run(stored()) == (len(ids), 2 * len(ids))


def test_bad_entries_are_handed_out_once_too(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    spool.append([make_batch("resp_1")])
    with path.open("ab") as fh:
        fh.write(encode_entry(make_batch("resp_torn"))[:30])
    go = tmp_path / "go"
    procs = [_python(REPLAYER, path, go, 0.0, tmp_path / f"ready-{n}", cwd=tmp_path) for n in range(2)]
    while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):
        time.sleep(0.005)
    go.touch()
    results = [json.loads(_finish(p)) for p in procs]
    assert sum(r["bad"] for r in results) == 1
    assert sorted(rid for r in results for rid in r["ids"]) == ["resp_1"]


# The two races below, made certain: the other party acts exactly inside the window.


def test_a_file_done_between_open_and_lock_is_not_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import eventguard.sink.spool as spool_module

    path = tmp_path / "spool.jsonl"
    first = Spool(path)
    first.append([make_batch("resp_1")])
    files = first.take()
    held = next(files)
    real = spool_module._lock

    def done_meanwhile(fd: int, *, exclusive: bool) -> bool:
        if exclusive and held.claimed:
            first.done(held)  # the first replay finishes after the second opened the file
        return real(fd, exclusive=exclusive)

    monkeypatch.setattr(spool_module, "_lock", done_meanwhile)
    assert list(Spool(path).take()) == []  # the file it opened is gone: nothing replayed twice
    assert not held.claimed and not first.pending()


@pytest.mark.parametrize("window", ["before_the_lock", "before_the_write"])
def test_an_append_whose_file_is_set_aside_meanwhile_is_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: str
) -> None:
    import eventguard.sink.spool as spool_module

    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    spool.append([make_batch("resp_0")])
    during: list[str] = []

    def another_replay() -> None:
        if not during:
            during.append("replayed")
            during.extend(_replay_here(Spool(path)))

    real_lock, real_write = spool_module._lock, os.write

    def lock(fd: int, *, exclusive: bool) -> bool:
        if not exclusive:
            another_replay()  # between the append's open and its lock
        return real_lock(fd, exclusive=exclusive)

    def write(fd: int, data: Any) -> int:
        if bytes(data[:4]) == b"\nEG1":
            another_replay()  # between the append's lock and its write
        return real_write(fd, data)

    if window == "before_the_lock":
        monkeypatch.setattr(spool_module, "_lock", lock)
    else:
        monkeypatch.setattr(os, "write", write)
    spool.append([make_batch("resp_1")])
    monkeypatch.undo()
    assert during[0] == "replayed"
    assert sorted(during[1:] + _replay_here(spool)) == ["resp_0", "resp_1"]
    assert not spool.pending()
