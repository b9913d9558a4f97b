"""What the SQL response store does that the in-memory one never has to: refuse a value it cannot
keep exactly, and report a database that is away or wrong as a storage error, never as not found."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from azure.ai.agentserver.responses.store._base import ResponseStoreCorruptionError
from sqlalchemy import text

from eventguard.errors import ResponseStoreError, SchemaMismatchError, UnstorableError
from eventguard.provider import SqlResponseProvider

from .conftest import Store, ctx
from .test_parity_with_the_hosts_store import envelope, item

T = 30


class Odd:
    """An object JSON has no spelling for."""


UNSTORABLE: list[tuple[str, Any]] = [
    ("tuple", {"metadata": {"t": (1, 2)}}),
    ("int-key", {"metadata": {1: "one"}}),
    ("bool-key", {"metadata": {True: "yes"}}),
    ("nan", {"temperature": math.nan}),
    ("infinity", {"temperature": math.inf}),
    ("object", {"metadata": {"o": Odd()}}),
    ("set", {"tools": {"a"}}),
    ("spelt-like-a-datetime", {"metadata": {"$eventguard.datetime": "2026-01-01T00:00:00"}}),
]


@pytest.mark.parametrize(("name", "fields"), UNSTORABLE, ids=[n for n, _f in UNSTORABLE])
async def test_a_value_json_cannot_hold_exactly_is_refused_and_nothing_is_stored(
    sql_store: Store, name: str, fields: dict[str, Any]
) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        with pytest.raises(UnstorableError):
            await p.create_response(envelope("resp_bad", **fields), None, None)
        with pytest.raises(KeyError):
            await p.get_response("resp_bad")
        await p.create_response(envelope("resp_ok"), None, None)
        with pytest.raises(UnstorableError):
            await p.update_response(envelope("resp_ok", status="completed", **fields))
        assert (await p.get_response("resp_ok"))["status"] == "in_progress"
        with pytest.raises(UnstorableError):
            await p.create_response(envelope("resp_bad_item"), [item("i1", metadata=fields)], None)
        assert await p.get_items(["i1"]) == [None]


@pytest.mark.parametrize("bad", [None, 7, b"resp_bytes"], ids=["none", "int", "bytes"])
async def test_an_id_that_is_not_a_string_is_refused(sql_store: Store, bad: object) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        with pytest.raises(UnstorableError):
            await p.create_response({"id": bad, "status": "queued"}, None, None)
        with pytest.raises(UnstorableError):
            await p.create_response(envelope("resp_h"), None, [bad])
        with pytest.raises(UnstorableError):
            await p.get_response(bad)
        if bad is not None:  # None is the anonymous partition
            with pytest.raises(UnstorableError):
                await p.get_response("resp_h", context=ctx(bad))  # type: ignore[arg-type]


async def _every_method(p: SqlResponseProvider) -> list[BaseException]:
    """Call all seven methods; what each raised."""
    calls = [
        p.create_response(envelope("resp_o"), [item("i1")], ["h1"]),
        p.get_response("resp_o"),
        p.update_response(envelope("resp_o", status="completed")),
        p.delete_response("resp_o"),
        p.get_input_items("resp_o"),
        p.get_items(["i1"]),
        p.get_history_item_ids("resp_o", "conv", -1),
    ]
    raised: list[BaseException] = []
    for call in calls:
        try:
            await call
        except Exception as exc:  # collected and checked one by one below
            raised.append(exc)
        else:
            raise AssertionError("a call to an unreachable database returned")
    return raised


def _is_storage_error(exc: BaseException) -> None:
    assert not isinstance(exc, KeyError | ValueError), repr(exc)
    assert isinstance(exc, ResponseStoreError), repr(exc)
    # The host's own "stored, but unreadable now": GET answers 500, recovery keeps the run.
    assert isinstance(exc, ResponseStoreCorruptionError), repr(exc)


async def test_a_postgresql_server_that_is_not_there_is_a_storage_error_never_not_found() -> None:
    p = SqlResponseProvider("postgresql://postgres:secret-pw@127.0.0.1:1/test", connect_timeout=2)
    async with asyncio.timeout(60):
        raised = await _every_method(p)
        await p.aclose()
    assert len(raised) == 7
    for exc in raised:
        _is_storage_error(exc)
        assert "secret-pw" not in str(exc)


async def test_tables_dropped_under_a_running_store_are_a_storage_error(sql_store: Store) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_t"), None, None)
        async with p.engine.begin() as conn:
            for table in ("links", "responses", "items", "history", "conversations"):
                await conn.execute(text(f"DROP TABLE eventguard_provider_{table}"))
        raised = await _every_method(p)
    for exc in raised:
        _is_storage_error(exc)


async def test_an_empty_database_without_auto_migrate_names_the_command(sql_database: Any) -> None:
    p = SqlResponseProvider(sql_database.url, schema=sql_database.schema, auto_migrate=False)
    async with asyncio.timeout(T):
        with pytest.raises(SchemaMismatchError) as err:
            await p.start()
        assert err.value.command == "eventguard db upgrade"
        # From the host's side the same problem is a storage error, not "not found".
        with pytest.raises(ResponseStoreError) as on_call:
            await p.get_response("resp_any")
        assert isinstance(on_call.value.__cause__, SchemaMismatchError)
        await p.aclose()
