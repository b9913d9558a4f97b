"""``scripts/host_instructions.py --where``: a callgrind output file read into instructions by place."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "host_instructions.py"

# Two objects, named first on a callee's line (cob=, cfi=) and by id alone after; an inlined header
# (fi=, back with fe=); a call whose inclusive cost (999) is not the caller's own; relative positions.
_CALLGRIND = """# callgrind format
version: 1
positions: line
events: Ir
summary: 1167

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) /build/Python/ceval.c
fn=(1) _PyEval_EvalFrameDefault
10 100
cob=(2) /usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6
cfi=(2) ./src/sqlite3.c
cfn=(2) sqlite3_step
calls=3 5
12 999
+1 7
fi=(3) /build/Include/object.h
5 20
fe=(1)
* 1

ob=(2)
fl=(2)
fn=(2)
5 40
"""


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_instructions_under_test", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_function_s_own_instructions_are_summed_by_library_and_interpreter_file(
    script: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text(_CALLGRIND, encoding="utf-8")
    places = script._places(out)
    assert dict(places) == {
        "python: ceval.c": 108,
        "python: object.h": 20,
        "libsqlite3.so.0.8.6": 40,
    }
    # The callee's inclusive cost was left out: the total is the file's own instructions.
    assert sum(places.values()) == 168


def test_a_torn_file_is_refused_naming_its_line(script: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    # callgrind killed mid-write: a cost line cut short, and what follows is not a cost either.
    torn = _CALLGRIND.replace("5 40\n", "5 4ob=(9\x00\udcff\n")
    out.write_text(torn, encoding="utf-8", errors="surrogateescape")
    with pytest.raises(ValueError, match=r"callgrind.out:25: not a cost line: '5 4ob=\(9"):
        script._places(out)


def test_a_cost_line_without_its_count_is_refused(script: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text(_CALLGRIND.replace("10 100\n", "10\n"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"callgrind.out:10: not a cost line: '10'"):
        script._places(out)


async def test_the_statement_clock_times_the_writer_thread_and_puts_its_functions_back(
    script: ModuleType, tmp_path: Path
) -> None:
    import asyncio
    import json

    from eventguard.sql import sqlite_thread
    from eventguard.sql.sqlite_thread import SqliteConnection, SqliteThread

    originals = (
        sqlite_thread.SqliteConnection.run,
        sqlite_thread._in_transaction,
        sqlite_thread.SqliteThread._checkpoint_if_due,
    )
    thread = SqliteThread(
        tmp_path / "t.db", busy_timeout_ms=1000, json_serializer=json.dumps, json_deserializer=json.loads
    )

    def job(conn: SqliteConnection) -> int:
        conn.run("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)", ())
        return conn.run("INSERT INTO t (v) VALUES (?)", ("x",))

    try:
        with script._StatementClock() as clock:
            async with asyncio.timeout(10):
                assert await thread.transaction(job) == 1
        assert set(clock.statements) == {"BEGIN IMMEDIATE", "CREATE TABLE IF", "INSERT INTO t", "COMMIT"}
        assert len(clock.transactions) == 1
    finally:
        await thread.close()
    assert (
        sqlite_thread.SqliteConnection.run,
        sqlite_thread._in_transaction,
        sqlite_thread.SqliteThread._checkpoint_if_due,
    ) == originals
