"""The store finds a response by the id the host gave it, even when the sink had to store another."""

from __future__ import annotations

import asyncio

import pytest

from eventguard.errors import InvalidQueryError
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore, stored_id

from .conftest import Target
from .helpers import run_guarded, script

HOSTILE_IDS = ["resp\x00nul", "resp\udcffsurrogate", "resp_" + "x" * 300]


@pytest.mark.parametrize("rid", HOSTILE_IDS, ids=["nul", "lone-surrogate", "too-long"])
async def test_a_response_stored_under_an_escaped_id_is_found_by_its_original_id(
    target: Target, rid: str
) -> None:
    async with asyncio.timeout(60):
        async with SqlSink(target.url, schema=target.schema, spool_path=target.spool) as sink:
            await run_guarded(sink, script(rid))
        async with ResponseStore(target.url, schema=target.schema) as store:
            row = await store.get(rid)
            history = await store.history(rid)
            by_stored = await store.get(stored_id(rid))
            page = await store.anomalies(response_id=rid)
    assert stored_id(rid) != rid
    assert row is not None and row.status == "completed"
    assert by_stored is not None and by_stored.response_id == row.response_id
    assert history is not None and sum(len(a.events) for a in history.attempts) == len(script(rid))
    assert any(a.kind == "value_escaped" for a in page.items)


def test_an_ordinary_id_is_its_own_key() -> None:
    for rid in ("resp_abc", "resp_with\\backslash", "ид-ответа", "x" * 255):
        assert stored_id(rid) == rid


@pytest.mark.parametrize("rid", [5, None, b"resp_abc", ["resp_abc"]], ids=["int", "none", "bytes", "list"])
async def test_an_id_that_is_not_a_str_is_an_invalid_query_naming_it(target: Target, rid: object) -> None:
    """Before, an AttributeError from deep inside (``'int' object has no attribute 'isascii'``)."""
    async with asyncio.timeout(60):
        async with SqlSink(target.url, schema=target.schema, spool_path=target.spool) as sink:
            await run_guarded(sink, script("resp_abc"))
        async with ResponseStore(target.url, schema=target.schema) as store:
            for read in (store.get, store.history, store.envelopes):
                with pytest.raises(InvalidQueryError, match=r"^response_id must be a str, not "):
                    await read(rid)  # type: ignore[arg-type]
            if rid is not None:  # None there means every response's anomalies
                with pytest.raises(InvalidQueryError, match=r"^response_id must be a str, not "):
                    await store.anomalies(response_id=rid)  # type: ignore[arg-type]
            assert (await store.get("resp_abc")) is not None  # the store still answers


async def test_an_id_spelt_as_another_ids_stored_form_is_a_response_of_its_own(target: Target) -> None:
    """``Y``, spelt exactly as the stored form of ``X`` (an id with a NUL), is another response:
    stored as it was, it shared X's row, Y's stream went to the quarantine as a duplicate, and
    ``history(Y)`` answered with X's events."""
    x = "resp_a\x00b"
    y = stored_id(x)
    assert y != x and stored_id(y) not in (x, y)
    async with asyncio.timeout(60):
        async with SqlSink(target.url, schema=target.schema, spool_path=target.spool) as sink:
            await run_guarded(sink, script(x, n_deltas=2))
            await run_guarded(sink, script(y, n_deltas=4))
            assert sink.stats.quarantined == 0
        async with ResponseStore(target.url, schema=target.schema) as store:
            hx, hy = await store.history(x), await store.history(y)
            gy = await store.get(y)
            page = await store.anomalies(response_id=y)
    assert hx is not None and hy is not None and gy is not None
    assert sum(len(a.events) for a in hx.attempts) == len(script(x, n_deltas=2))
    assert sum(len(a.events) for a in hy.attempts) == len(script(y, n_deltas=4))
    assert gy.response_id == stored_id(y) != hx.response.response_id
    assert [a.kind for a in page.items] == ["value_escaped"]  # Y's own, saying it was stored changed
