"""The SQL response store behaves as the host's in-memory one: every case runs against both.

Written from the protocol's docstrings and the host's ``store/_memory.py`` (2.2.0b1 and 2.4.0b1),
in this project's words; cases for rules 2.4.0b1 added are skipped for the 2.2.0b1 reference only.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.ai.agentserver.responses.store import ResponseAlreadyExistsError

from .conftest import Store, ctx, newest_rules

T = 30  # seconds any one case may take


def envelope(rid: str, **fields: Any) -> dict[str, Any]:
    """A response envelope as the host stores it."""
    return {"id": rid, "object": "response", "status": "in_progress", "output": [], **fields}


def item(iid: str, text: str = "hello", **fields: Any) -> dict[str, Any]:
    return {
        "id": iid,
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
        **fields,
    }


def out(iid: str, text: str = "answer") -> dict[str, Any]:
    return {
        "id": iid,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# -- create, get, update, delete --------------------------------------------------------------------


async def test_a_created_response_reads_back_equal(store: Store) -> None:
    p = store.provider
    response = envelope("resp_a", metadata={"k": "v"}, background=True)
    async with asyncio.timeout(T):
        await p.create_response(response, [item("in_1")], None)
        assert await p.get_response("resp_a") == response


async def test_getting_a_missing_response_raises_key_error(store: Store) -> None:
    async with asyncio.timeout(T):
        with pytest.raises(KeyError):
            await store.provider.get_response("resp_missing")


async def test_a_second_create_of_a_live_id_raises_already_exists(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_dup"), None, None)
        with pytest.raises(ResponseAlreadyExistsError) as err:
            await p.create_response(envelope("resp_dup", status="completed"), None, None)
        assert err.value.response_id == "resp_dup"
        assert (await p.get_response("resp_dup"))["status"] == "in_progress"


async def test_an_update_replaces_the_envelope(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_u"), None, None)
        done = envelope("resp_u", status="completed", output=[out("msg_1")], usage={"total_tokens": 3})
        await p.update_response(done)
        assert await p.get_response("resp_u") == done


async def test_updating_a_missing_response_raises_key_error_and_creates_nothing(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        with pytest.raises(KeyError):
            await p.update_response(envelope("resp_nobody"))
        with pytest.raises(KeyError):
            await p.get_response("resp_nobody")


async def test_a_deleted_response_is_gone_for_get_update_and_delete(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_d"), [item("in_d")], None)
        await p.delete_response("resp_d")
        with pytest.raises(KeyError):
            await p.get_response("resp_d")
        with pytest.raises(KeyError):
            await p.update_response(envelope("resp_d", status="completed"))
        with pytest.raises(KeyError):
            await p.delete_response("resp_d")


async def test_deleting_a_missing_response_raises_key_error(store: Store) -> None:
    async with asyncio.timeout(T):
        with pytest.raises(KeyError):
            await store.provider.delete_response("resp_missing")


async def test_a_deleted_id_can_be_created_again_with_new_content(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_r", status="failed"), [item("in_old")], None)
        await p.delete_response("resp_r")
        again = envelope("resp_r", status="queued")
        await p.create_response(again, [item("in_new")], None)
        assert await p.get_response("resp_r") == again
        items = await p.get_input_items("resp_r", ascending=True)
        assert [i["id"] for i in items] == ["in_new"]


# -- copies ------------------------------------------------------------------------------------------


async def test_what_the_caller_mutates_after_a_write_does_not_reach_the_store(store: Store) -> None:
    p = store.provider
    response = envelope("resp_c", metadata={"a": "1"})
    inputs = [item("in_c")]
    async with asyncio.timeout(T):
        await p.create_response(response, inputs, None)
        kept = copy.deepcopy(response)
        response["metadata"]["a"] = "changed"
        response["status"] = "completed"
        inputs[0]["content"][0]["text"] = "changed"
        assert await p.get_response("resp_c") == kept
        assert (await p.get_items(["in_c"]))[0]["content"][0]["text"] == "hello"

        update = envelope("resp_c", status="completed", output=[out("msg_c")])
        await p.update_response(update)
        update["output"][0]["content"][0]["text"] = "changed"
        assert (await p.get_response("resp_c"))["output"][0]["content"][0]["text"] == "answer"


async def test_every_read_returns_a_fresh_copy(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_f", output=[out("msg_f")]), [item("in_f")], None)
        first = await p.get_response("resp_f")
        first["output"].clear()
        assert (await p.get_response("resp_f"))["output"] == [out("msg_f")]
        (got,) = await p.get_items(["in_f"])
        got["id"] = "mutated"
        assert (await p.get_items(["in_f"]))[0]["id"] == "in_f"
        page = await p.get_input_items("resp_f")
        page[0]["role"] = "mutated"
        assert (await p.get_input_items("resp_f"))[0]["role"] == "user"


# -- input items -------------------------------------------------------------------------------------


async def _chained(p: Any) -> None:
    """resp_1 (inputs i1 i2, output o1) <- resp_2 (history of resp_1, inputs i3 i4)."""
    await p.create_response(envelope("resp_1"), [item("i1"), item("i2")], None)
    await p.update_response(envelope("resp_1", status="completed", output=[out("o1")]))
    history = await p.get_history_item_ids("resp_1", None, 100)
    assert history == ["i1", "i2", "o1"]
    await p.create_response(
        envelope("resp_2", previous_response_id="resp_1"), [item("i3"), item("i4")], history
    )


async def test_input_items_are_history_then_input_newest_first(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await _chained(p)
        assert [i["id"] for i in await p.get_input_items("resp_2")] == ["i4", "i3", "o1", "i2", "i1"]
        ascending = await p.get_input_items("resp_2", ascending=True)
        assert [i["id"] for i in ascending] == ["i1", "i2", "o1", "i3", "i4"]
        assert ascending[0] == item("i1")


async def test_input_items_page_by_after_and_before(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await _chained(p)
        ids = [i["id"] for i in await p.get_input_items("resp_2", ascending=True, after="i2")]
        assert ids == ["o1", "i3", "i4"]
        ids = [i["id"] for i in await p.get_input_items("resp_2", ascending=True, before="i3")]
        assert ids == ["i1", "i2", "o1"]
        ids = [i["id"] for i in await p.get_input_items("resp_2", after="i4", before="i1")]
        assert ids == ["i3", "o1", "i2"]
        ids = [i["id"] for i in await p.get_input_items("resp_2", limit=2, after="nowhere")]
        assert ids == ["i4", "i3"]


async def test_input_items_limit_is_clamped_to_one_through_a_hundred(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_l"), [item(f"i{n:03}") for n in range(120)], None)
        assert len(await p.get_input_items("resp_l", limit=0)) == 1
        assert len(await p.get_input_items("resp_l", limit=-5)) == 1
        assert len(await p.get_input_items("resp_l", limit=500)) == 100
        assert len(await p.get_input_items("resp_l")) == 20


async def test_input_items_skip_ids_with_no_stored_item(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_s"), [item("i1"), {"type": "message"}], ["ghost", "i0"])
        assert [i["id"] for i in await p.get_input_items("resp_s", ascending=True)] == ["i1"]


async def test_input_items_of_a_missing_response_raise_key_error(store: Store) -> None:
    async with asyncio.timeout(T):
        with pytest.raises(KeyError):
            await store.provider.get_input_items("resp_missing")


async def test_input_items_of_a_deleted_response_raise_value_error(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_x"), [item("i1")], None)
        await p.delete_response("resp_x")
        with pytest.raises(ValueError, match="deleted"):
            await p.get_input_items("resp_x")


# -- items -------------------------------------------------------------------------------------------


async def test_items_come_back_in_the_order_asked_with_none_for_unknown_ids(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_i", output=[out("o1")]), [item("i1"), item("i2")], None)
        got = await p.get_items(["i2", "nope", "o1", "i1", "i2"])
        assert got == [item("i2"), None, out("o1"), item("i1"), item("i2")]
        assert await p.get_items([]) == []


async def test_output_items_of_an_update_are_stored_as_items(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_o"), None, None)
        await p.update_response(envelope("resp_o", status="completed", output=[out("o1"), out("o2", "two")]))
        assert await p.get_items(["o1", "o2"]) == [out("o1"), out("o2", "two")]


async def test_items_outlive_their_response(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_g", output=[out("o1")]), [item("i1")], None)
        await p.delete_response("resp_g")
        assert await p.get_items(["i1", "o1"]) == [item("i1"), out("o1")]


async def test_the_last_write_of_an_item_id_wins(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_w1"), [item("shared", "first")], None)
        await p.create_response(envelope("resp_w2"), [item("shared", "second")], None)
        assert await p.get_items(["shared"]) == [item("shared", "second")]


# -- history -----------------------------------------------------------------------------------------


async def test_history_by_previous_response_is_its_history_input_and_output(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await _chained(p)
        await p.update_response(envelope("resp_2", status="completed", output=[out("o2")]))
        assert await p.get_history_item_ids("resp_2", None, 100) == ["i1", "i2", "o1", "i3", "i4", "o2"]
        assert await p.get_history_item_ids("resp_2", None, 2) == ["i4", "o2"]


async def test_history_of_a_missing_or_deleted_previous_response_is_empty(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        assert await p.get_history_item_ids("resp_missing", None, 100) == []
        await p.create_response(envelope("resp_h"), [item("i1")], None)
        await p.delete_response("resp_h")
        assert await p.get_history_item_ids("resp_h", None, 100) == []
        assert await p.get_history_item_ids(None, None, 100) == []


async def test_history_limit_zero_or_less_gives_nothing(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_z"), [item("i1")], None)
        assert await p.get_history_item_ids("resp_z", None, 0) == []
        assert await p.get_history_item_ids("resp_z", None, -7) == []


async def test_history_limit_minus_one_means_all(store: Store) -> None:
    newest_rules(store)
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_all"), [item(f"i{n}") for n in range(150)], None)
        assert len(await p.get_history_item_ids("resp_all", None, -1)) == 150


async def test_history_is_deduplicated_keeping_the_first_occurrence(store: Store) -> None:
    newest_rules(store)
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(
            envelope("resp_dd", output=[out("i1"), out("o9")]), [item("i2"), item("i1")], ["i1", "h", "i2"]
        )
        assert await p.get_history_item_ids("resp_dd", None, -1) == ["i1", "h", "i2", "o9"]


async def test_history_by_conversation_walks_its_members_in_creation_order(store: Store) -> None:
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_c1", conversation="conv_1"), [item("a1")], None)
        await p.update_response(envelope("resp_c1", conversation="conv_1", output=[out("a2")]))
        await p.create_response(envelope("resp_other", conversation="conv_2"), [item("zz")], None)
        await p.create_response(envelope("resp_c2", conversation={"id": "conv_1"}), [item("b1")], None)
        await p.create_response(envelope("resp_c3", conversation="conv_1"), [item("c1")], None)
        await p.delete_response("resp_c3")
        assert await p.get_history_item_ids(None, "conv_1", 100) == ["a1", "a2", "b1"]
        assert await p.get_history_item_ids(None, "conv_none", 100) == []
        both = await p.get_history_item_ids("resp_other", "conv_1", 100)
        assert both == ["zz", "a1", "a2", "b1"]


async def test_a_recreated_member_keeps_its_place_in_the_conversation(store: Store) -> None:
    newest_rules(store)  # 2.2.0b1's store listed it twice (no de-duplication)
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_m1", conversation="conv"), [item("x1")], None)
        await p.create_response(envelope("resp_m2", conversation="conv"), [item("y1")], None)
        await p.delete_response("resp_m1")
        await p.create_response(envelope("resp_m1", conversation="conv"), [item("x2")], None)
        assert await p.get_history_item_ids(None, "conv", 100) == ["x2", "y1"]


# -- partitions --------------------------------------------------------------------------------------


async def test_anonymous_empty_and_named_users_are_separate_partitions(store: Store) -> None:
    newest_rules(store)
    p = store.provider
    async with asyncio.timeout(T):
        for user in (None, "", "alice"):
            rid = "resp_same"
            await p.create_response(
                envelope(rid, metadata={"who": repr(user)}), [item("i1", repr(user))], None, context=ctx(user)
            )
        for user in (None, "", "alice"):
            got = await p.get_response("resp_same", context=ctx(user))
            assert got["metadata"] == {"who": repr(user)}
            assert (await p.get_items(["i1"], context=ctx(user)))[0]["content"][0]["text"] == repr(user)
        # No context is the anonymous partition too.
        assert (await p.get_response("resp_same"))["metadata"] == {"who": "None"}
        with pytest.raises(KeyError):
            await p.get_response("resp_same", context=ctx("bob"))
        assert await p.get_items(["i1"], context=ctx("bob")) == [None]
        await p.delete_response("resp_same", context=ctx("alice"))
        assert (await p.get_response("resp_same", context=ctx("")))["metadata"] == {"who": "''"}


async def test_history_and_conversations_stay_within_their_partition(store: Store) -> None:
    newest_rules(store)
    p = store.provider
    async with asyncio.timeout(T):
        await p.create_response(
            envelope("resp_p", conversation="conv"), [item("i_alice")], None, context=ctx("alice")
        )
        assert await p.get_history_item_ids("resp_p", None, -1, context=ctx("bob")) == []
        assert await p.get_history_item_ids(None, "conv", -1, context=ctx("bob")) == []
        assert await p.get_history_item_ids(None, "conv", -1, context=ctx("alice")) == ["i_alice"]
        with pytest.raises(KeyError):
            await p.get_input_items("resp_p", context=ctx("bob"))


# -- exact round trip --------------------------------------------------------------------------------


HOSTILE = [
    "nul\x00inside",
    "lone surrogate \udcff here",
    "\x1b[31mred\x1b[0m and \u202eright-to-left",
    "emoji \U0001f600 and CJK \u4e2d\u6587",
    "back\\slash ~tilde",
]


async def test_the_frameworks_internal_metadata_round_trips_exactly(store: Store) -> None:
    p = store.provider
    response = envelope(
        "resp_meta",
        metadata={"_internal_metadata": {"agent_session_id": "s1", "nested": {"n": [1, 2.5, None, True]}}},
        output=[{**out("o1"), "internal_metadata": {"checkpoint": "c1", "seq": 7}}],
    )
    inputs = [{**item("i1"), "internal_metadata": {"source": "client", "raw": {"x": []}}}]
    async with asyncio.timeout(T):
        await p.create_response(response, inputs, None)
        assert await p.get_response("resp_meta") == response
        assert await p.get_items(["i1", "o1"]) == [inputs[0], response["output"][0]]


async def test_a_datetime_in_a_checkpoint_envelope_reads_back_as_the_same_datetime(store: Store) -> None:
    """The host's resilient checkpoints carry ``created_at`` as a datetime (found end to end)."""
    p = store.provider
    at = datetime(2026, 12, 1, 19, 5, 27, 486978, tzinfo=UTC)
    naive = datetime(2026, 1, 2, 3, 4, 5)
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_dt", created_at=at), None, None)
        await p.update_response(envelope("resp_dt", created_at=at, metadata={"n": naive}))
        got = await p.get_response("resp_dt")
        assert got == envelope("resp_dt", created_at=at, metadata={"n": naive})
        assert got["created_at"].tzinfo is not None and got["metadata"]["n"].tzinfo is None


@pytest.mark.parametrize("text", HOSTILE, ids=["nul", "surrogate", "ansi-bidi", "unicode", "backslash"])
async def test_hostile_strings_in_content_round_trip_exactly(store: Store, text: str) -> None:
    p = store.provider
    response = envelope("resp_hostile", metadata={text: text}, instructions=text, output=[out("o1", text)])
    async with asyncio.timeout(T):
        await p.create_response(response, [item("i1", text)], None)
        assert await p.get_response("resp_hostile") == response
        assert await p.get_items(["i1", "o1"]) == [item("i1", text), out("o1", text)]


@pytest.mark.parametrize("text", HOSTILE, ids=["nul", "surrogate", "ansi-bidi", "unicode", "backslash"])
async def test_hostile_ids_are_kept_apart_and_round_trip(store: Store, text: str) -> None:
    p = store.provider
    rid, iid, conv = f"resp_{text}", f"item_{text}", f"conv_{text}"
    async with asyncio.timeout(T):
        await p.create_response(envelope(rid, conversation=conv), [item(iid)], None, context=ctx(text))
        # An id that differs only in the hostile character is another response.
        await p.create_response(envelope("resp_" + text.replace(text[3], "?")), None, None, context=ctx(text))
        assert (await p.get_response(rid, context=ctx(text)))["id"] == rid
        assert await p.get_history_item_ids(rid, None, 10, context=ctx(text)) == [iid]
        assert await p.get_history_item_ids(None, conv, 5, context=ctx(text)) == [iid]
        assert [i["id"] for i in await p.get_input_items(rid, context=ctx(text))] == [iid]


async def test_a_megabyte_of_content_and_a_megabyte_id_round_trip(store: Store) -> None:
    p = store.provider
    big = "x" * (1 << 20)
    rid = "resp_" + "y" * (1 << 20)
    response = envelope(rid, instructions=big)
    async with asyncio.timeout(T):
        await p.create_response(response, [item("i_" + big, big)], ["h_" + big])
        assert await p.get_response(rid) == response
        assert await p.get_history_item_ids(rid, None, 10) == ["h_" + big, "i_" + big]
        assert await p.get_items(["i_" + big]) == [item("i_" + big, big)]
