"""Every hostile string in every slot of the host's SQL response store, counted: what went in comes back
exact from every reader, or is refused with a typed error; nothing is changed or lost in between.

Three ways in, on SQLite and PostgreSQL:

- the store's own methods (``SqlResponseProvider``, what the host calls): each value of
  :data:`tests._hostile.STRINGS` and ``LOOKALIKES`` in each slot (response, item, history and
  conversation ids, the user's partition key, metadata and ``_internal_metadata``, item
  ``internal_metadata``, input text, status), read back by every reader (the seven methods, a
  second provider on the same database, ``ResponseStore.envelopes``, a second turn's history);
- wrong shapes (not a string, not a mapping, NaN, a tuple, a non-string key, too deep): refused
  with :class:`UnstorableError` and nothing stored;
- HTTP, through the real ``ResponsesHostServer`` in-process: input text (echoed back as output),
  conversation ids, the ``x-agent-user-id`` partition and the ``x-agent-response-id`` header.

Each test keeps a :class:`tests._hostile.Tally` and asserts it: every value went in, each came back
exact or was refused by name; ``EVENTGUARD_HOSTILE_REPORT`` (a file) collects the lines.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import pytest
from azure.ai.agentserver.responses import PlatformContext
from azure.ai.agentserver.responses._id_generator import IdGenerator

from eventguard import ResponseStore
from eventguard.errors import InvalidQueryError, UnstorableError
from eventguard.foundry import GuardedResponsesHostServer
from eventguard.provider import ProviderStorageError, SqlResponseProvider
from eventguard.testing import ScriptedChatClient, chat_agent
from tests._hostile import LOOKALIKES, STRINGS, Tally, record

from .conftest import Database, Store
from .test_parity_with_the_hosts_store import envelope, item, out

T = 120.0  # seconds one slot's values may take (eleven of them are a megabyte)
VALUES: dict[str, str] = {**STRINGS, **LOOKALIKES}
SLOTS = (
    "response_id",
    "input_item_id",
    "output_item_id",
    "history_item_id",
    "conversation_id",
    "user_key",
    "metadata",
    "internal_metadata",
    "item_internal_metadata",
    "input_text",
    "status",
)


# -- the store's own methods ---------------------------------------------------------------------


class Case:
    """One value in one slot; every other slot holds a plain value of its own (``#c<n>`` apart)."""

    def __init__(self, n: int, slot: str, value: str) -> None:
        tag = f"#c{n}"
        hostile = value + tag

        def at(name: str, plain: str) -> str:
            return hostile if slot == name else plain + tag

        self.rid = at("response_id", "resp")
        self.iid = at("input_item_id", "in")
        self.oid = at("output_item_id", "out")
        self.hid = at("history_item_id", "hist")
        self.conv = at("conversation_id", "conv")
        self.user = at("user_key", "user")
        self.text = at("input_text", "hello")
        self.status = hostile if slot == "status" else "completed"
        inner = {"agent_session_id": hostile if slot == "internal_metadata" else "s1", "n": [1, 2.5, None]}
        self.metadata: dict[str, Any] = {"_internal_metadata": inner}
        if slot == "metadata":
            self.metadata[hostile] = hostile
        extra = {"internal_metadata": {"checkpoint": hostile}} if slot == "item_internal_metadata" else {}
        self.input = {**item(self.iid, self.text), **extra}
        self.output = {**out(self.oid, self.text), **extra}
        self.created = envelope(self.rid, conversation=self.conv, metadata=self.metadata)
        self.done = envelope(
            self.rid, conversation=self.conv, metadata=self.metadata, status=self.status, output=[self.output]
        )
        self.ctx = PlatformContext(user_id_key=self.user)


async def write(p: SqlResponseProvider, c: Case) -> None:
    await p.create_response(c.created, [c.input], [c.hid], context=c.ctx)
    await p.update_response(c.done, context=c.ctx)


async def read_back(store: Store, c: Case) -> list[str]:
    """What each reader gave that differs from what went in (empty: all exact)."""
    p: SqlResponseProvider = store.provider
    wrong: list[str] = []

    def check(reader: str, got: object, expected: object) -> None:
        if got != expected:
            wrong.append(f"{reader} gave {str(got)[:120]!a}")

    history = [c.hid, c.iid, c.oid]
    check("get_response", await p.get_response(c.rid, context=c.ctx), c.done)
    check("get_items", await p.get_items([c.iid, c.oid, c.hid], context=c.ctx), [c.input, c.output, None])
    check("get_input_items", await p.get_input_items(c.rid, ascending=True, context=c.ctx), [c.input])
    check("history by previous", await p.get_history_item_ids(c.rid, None, -1, context=c.ctx), history)
    check("history by conversation", await p.get_history_item_ids(None, c.conv, -1, context=c.ctx), history)
    other = store.another()
    try:
        check("another process", await other.get_response(c.rid, context=c.ctx), c.done)
    finally:
        await other.aclose()
    async with ResponseStore(store.url, schema=store.schema) as rs:
        mine = [e for e in await rs.envelopes(c.rid) if e.envelope == c.done]
    check(
        "ResponseStore.envelopes", [(e.input_items, e.output_items) for e in mine], [([c.input], [c.output])]
    )
    # A second turn on it: the history (run, item_key columns) carries every id exactly.
    nxt = envelope(c.rid + "/next", previous_response_id=c.rid)
    turn = {**item(c.iid + "/next")}
    await p.create_response(nxt, [turn], history, context=c.ctx)
    got = await p.get_input_items(nxt["id"], ascending=True, context=c.ctx)
    check("second turn's input items", got, [c.input, c.output, turn])
    check("second turn's history", await p.get_history_item_ids(nxt["id"], None, -1, context=c.ctx),
          [*history, turn["id"]])  # fmt: skip
    await p.delete_response(c.rid, context=c.ctx)
    try:
        await p.get_response(c.rid, context=c.ctx)
        wrong.append("a deleted response still reads")
    except KeyError:
        pass
    check(
        "items outlive their response", await p.get_items([c.iid, c.oid], context=c.ctx), [c.input, c.output]
    )
    return wrong


@pytest.mark.parametrize("slot", SLOTS)
async def test_each_hostile_string_in_the_slot_reads_back_exactly_from_every_reader(
    sql_store: Store, slot: str
) -> None:
    tally = Tally()
    async with asyncio.timeout(T):
        for n, (kind, value) in enumerate(VALUES.items()):
            case = Case(n, slot, value)
            try:
                await write(sql_store.provider, case)
            except (UnstorableError, ProviderStorageError) as exc:
                tally.refused(exc)
                continue
            wrong = await read_back(sql_store, case)
            if wrong:
                tally.bad(kind, "; ".join(wrong))
            else:
                tally.exact()
    line = record(tally, f"provider {sql_store.kind} {slot}")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(VALUES), line


# -- wrong shapes --------------------------------------------------------------------------------

Call = Callable[[SqlResponseProvider], Awaitable[object]]


def _deep(levels: int) -> object:
    return functools.reduce(lambda inner, _: [inner], range(levels), [])


def _create(rid: str, *, inputs: Any = None, history: Any = None, user: Any = None, **fields: Any) -> Call:
    def call(p: SqlResponseProvider) -> Awaitable[object]:
        return p.create_response(
            envelope(rid, **fields), inputs, history, context=PlatformContext(user_id_key=user)
        )

    return call


#: (name, the call, the response id it must leave unstored or None).
SHAPES: list[tuple[str, Call, str | None]] = [
    ("response id an int", lambda p: p.create_response({"id": 5, "status": "queued"}, None, None), None),
    ("response id missing", lambda p: p.create_response({"status": "queued"}, None, None), None),
    ("response not a mapping", lambda p: p.create_response(["resp_list"], None, None), None),
    ("update not a mapping", lambda p: p.update_response("resp_str"), None),
    ("user key an int", _create("resp_s1", user=5), "resp_s1"),
    ("user key bytes", _create("resp_s2", user=b"alice"), "resp_s2"),
    ("metadata a tuple", _create("resp_s3", metadata={"t": (1, 2)}), "resp_s3"),
    ("metadata a non-string key", _create("resp_s4", metadata={1: "one"}), "resp_s4"),
    ("metadata a bool key", _create("resp_s5", metadata={True: "yes"}), "resp_s5"),
    ("metadata NaN", _create("resp_s6", metadata={"n": math.nan}), "resp_s6"),
    ("metadata infinity", _create("resp_s7", metadata={"n": -math.inf}), "resp_s7"),
    ("metadata a set", _create("resp_s8", metadata={"s": {1}}), "resp_s8"),
    ("metadata an object", _create("resp_s9", metadata={"o": object()}), "resp_s9"),
    ("metadata bytes", _create("resp_s10", metadata={"b": b"\x00"}), "resp_s10"),
    ("metadata 100,000 levels deep", _create("resp_s11", metadata={"d": _deep(100_000)}), "resp_s11"),
    (
        "the datetime tag spelt by hand",
        _create("resp_s12", metadata={"$eventguard.datetime": "2026-01-01"}),
        "resp_s12",
    ),
    ("a history id an int", _create("resp_s13", history=["h1", 7]), "resp_s13"),
    ("an input item's body a tuple", _create("resp_s14", inputs=[{"id": "i_t", "c": (1,)}]), "resp_s14"),
    ("get_response of an int", lambda p: p.get_response(5), None),  # type: ignore[arg-type]
    ("delete_response of None", lambda p: p.delete_response(None), None),  # type: ignore[arg-type]
    ("get_items with an int id", lambda p: p.get_items(["i1", 3]), None),  # type: ignore[list-item]
    ("history of an int conversation", lambda p: p.get_history_item_ids(None, 5, 10), None),  # type: ignore[arg-type]
    ("history of a bytes previous id", lambda p: p.get_history_item_ids(b"resp", None, 10), None),  # type: ignore[arg-type]
    ("input items of a list id", lambda p: p.get_input_items(["resp"]), None),  # type: ignore[arg-type]
]


async def test_wrong_shapes_are_refused_with_unstorable_error_and_store_nothing(sql_store: Store) -> None:
    p: SqlResponseProvider = sql_store.provider
    tally = Tally()
    async with asyncio.timeout(T):
        for name, call, rid in SHAPES:
            try:
                got = await call(p)
            except UnstorableError as exc:
                tally.refused(exc)
            except Exception as exc:  # a storage error or a bare TypeError is the wrong answer here
                tally.bad(name, f"{type(exc).__name__}: {exc}"[:200])
                continue
            else:
                tally.bad(name, f"accepted: {got!r:.80}")
                continue
            if rid is not None:
                with pytest.raises(KeyError):
                    await p.get_response(rid)
                with pytest.raises(KeyError):
                    await p.get_response(rid, context=PlatformContext(user_id_key=None))
    line = record(tally, f"provider {sql_store.kind} wrong shapes")
    assert tally.wrong == [], line
    assert tally.outcomes["refused:UnstorableError"] == len(SHAPES), line


async def test_arguments_of_the_wrong_type_are_refused_as_bad_arguments_not_as_a_broken_database(
    sql_store: Store,
) -> None:
    p: SqlResponseProvider = sql_store.provider
    bad_argument = (UnstorableError, InvalidQueryError)
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_args"), [item("i1")], None)
        calls: Sequence[Callable[[], Awaitable[object]]] = (
            lambda: p.get_input_items("resp_args", limit="20"),  # type: ignore[arg-type]
            lambda: p.get_input_items("resp_args", limit=None),  # type: ignore[arg-type]
            lambda: p.get_history_item_ids("resp_args", None, "5"),  # type: ignore[arg-type]
            lambda: p.create_response(envelope("resp_args2"), 5, None),  # type: ignore[arg-type]
            lambda: p.get_items(5),  # type: ignore[arg-type]
            lambda: p.get_items("i1"),
            # One item where a list was meant: iterated, a dict is its keys, and the item was lost.
            lambda: p.create_response(envelope("resp_args3"), item("i3"), None),  # type: ignore[arg-type]
            lambda: p.create_response(envelope("resp_args4"), [item("i4")], {"id": "h"}),  # type: ignore[arg-type]
            lambda: p.get_items({"i1": 1}),  # type: ignore[arg-type]
        )
        for call in calls:
            with pytest.raises(bad_argument):
                await call()
        for refused in ("resp_args3", "resp_args4"):
            with pytest.raises(KeyError):
                await p.get_response(refused)  # refused as a whole: nothing of it stored


# -- through the real host, by HTTP ----------------------------------------------------------------


class Echo(ScriptedChatClient):
    """Answers with the last message's text, exactly: the input's hostile text comes back as output."""

    def _inner_get_response(self, *, messages: Any, stream: bool, options: Any, **kwargs: Any) -> Any:
        text = messages[-1].text if messages else ""
        script = ScriptedChatClient((text,))
        return script._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [c.get("text") for i in items for c in i.get("content", []) if isinstance(c, dict)]


def _latin1(value: str) -> bytes | None:
    """A header value as HTTP carries it (latin-1 bytes); None when it cannot travel in a header."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return None


class Http:
    """One in-process host on the database and what a hostile request did to it."""

    def __init__(self, server: GuardedResponsesHostServer, client: httpx.AsyncClient) -> None:
        self.server = server
        self.client = client
        storage = server.eventguard_storage
        assert storage is not None and storage.provider is not None
        self.provider = storage.provider

    async def post(self, body: dict[str, Any], headers: dict[str, bytes] | None = None) -> httpx.Response:
        raw = json.dumps({"model": "m", **body}, ensure_ascii=True)
        sent = {"content-type": b"application/json", **(headers or {})}
        async with asyncio.timeout(T):
            return await self.client.post("/responses", content=raw, headers=sent)

    async def get(self, path: str, headers: dict[str, bytes] | None = None) -> httpx.Response:
        async with asyncio.timeout(T):
            return await self.client.get(path, headers=headers or {})


def host_500(response: httpx.Response) -> bool:
    """The host's own 500: its JSON error, no traceback in the body."""
    if response.status_code != 500:
        return False
    body = response.text
    return "Traceback" not in body and 'File "' not in body


async def _http_input_text(h: Http, value: str, tally: Tally, kind: str) -> None:
    """The text as the input of a turn (echoed as its output), then chained by a second turn."""
    rid = IdGenerator.new_response_id()
    made = await h.post({"input": value}, {"x-agent-response-id": rid.encode()})
    try:
        stored = await h.provider.get_response(rid)
    except KeyError:
        tally.bad(kind, f"POST {made.status_code}, nothing stored: {made.text[:120]}")
        return
    if _texts(stored["output"]) != [value] or _texts(await h.provider.get_input_items(rid)) != [value]:
        tally.bad(kind, "the store does not hold the text exactly")
        return
    if host_500(made):
        # Stored exactly (checked above); the host's JSON renderer cannot write a lone surrogate.
        tally.other("host_500_after_storing")
        return
    nxt = await h.post({"input": "next", "previous_response_id": rid})
    got, items = (
        await h.get(f"/responses/{rid}"),
        await h.get(f"/responses/{nxt.json()['id']}/input_items?order=asc"),
    )
    same = (
        made.status_code == got.status_code == items.status_code == 200
        and _texts(got.json()["output"]) == [value]
        and _texts(items.json()["data"]) == [value, value, "next"]  # turn one's input, its echo, turn two
    )
    tally.exact() if same else tally.bad(
        kind, f"GET {got.status_code}/{items.status_code} {items.text[:160]!a}"
    )


async def _http_conversation(h: Http, value: str, tally: Tally, kind: str) -> None:
    """The id as a conversation (a string, then ``{"id": ...}``): both turns are its members."""
    conv = "conv_" + value
    first = await h.post({"input": "one", "conversation": conv})
    if host_500(first):
        tally.other("host_500")
        return
    second = await h.post({"input": "two", "conversation": {"id": conv}})
    if first.status_code != 200 or second.status_code != 200:
        tally.bad(kind, f"POST {first.status_code}/{second.status_code}: {second.text[:120]}")
        return
    stored = [await h.provider.get_response(r.json()["id"]) for r in (first, second)]
    members = await h.provider.get_history_item_ids(None, conv, -1)
    same = [s["conversation"] for s in stored] == [{"id": conv}] * 2 and len(members) == 4
    tally.exact() if same else tally.bad(kind, f"{[s['conversation'] for s in stored]!a:.160} {members}")


async def _http_user(h: Http, value: str, tally: Tally, kind: str) -> bool:
    header = _latin1(value)
    if header is None:
        return False  # cannot travel in an HTTP header: not sent, not counted
    made = await h.post({"input": "mine"}, {"x-agent-user-id": header})
    if made.status_code != 200:
        tally.bad(kind, f"POST {made.status_code}: {made.text[:120]}")
        return True
    rid = made.json()["id"]
    own = await h.get(f"/responses/{rid}", {"x-agent-user-id": header})
    anyone = await h.get(f"/responses/{rid}")
    stored = await h.provider.get_response(rid, context=PlatformContext(user_id_key=header.decode("latin-1")))
    same = own.status_code == 200 and anyone.status_code == 404 and stored["id"] == rid
    tally.exact() if same else tally.bad(kind, f"own {own.status_code}, anyone {anyone.status_code}")
    return True


async def _http_response_id(h: Http, value: str, tally: Tally, kind: str) -> None:
    """The id in ``x-agent-response-id`` (latin-1) or, past what a header holds, in the body."""
    rid = "caresp_" + (value + "0" * 50)[:50] if len(value) < 50 else "caresp_" + value
    header = _latin1(rid)
    if header is not None:
        made = await h.post({"input": "id"}, {"x-agent-response-id": header})
    else:
        made = await h.post({"input": "id", "response_id": rid})
    if made.status_code == 200:
        stored = await h.provider.get_response(rid)
        tally.exact() if stored["id"] == rid else tally.bad(kind, "stored under another id")
        return
    try:
        await h.provider.get_response(rid)
        tally.bad(kind, f"refused with {made.status_code} but stored")
        return
    except KeyError:
        pass
    if 400 <= made.status_code < 500:
        tally.refused(f"http_{made.status_code}")
    elif host_500(made):
        tally.other("host_500")
    else:
        tally.bad(kind, f"{made.status_code}: {made.text[:120]}")


async def test_hostile_values_sent_over_http_reach_the_store_exactly_or_are_refused(
    sql_database: Database,
) -> None:
    agent, _probe = chat_agent(Echo(), name="hostile-echo")
    server = GuardedResponsesHostServer(
        agent, database=sql_database.url, schema=sql_database.schema, configure_observability=None
    )
    transport = httpx.ASGITransport(app=server, raise_app_exceptions=False)
    tallies = {slot: Tally() for slot in ("input_text", "conversation_id", "user_key", "response_id")}
    unsendable = 0
    async with (
        asyncio.timeout(4 * T),
        server.router.lifespan_context(server),
        httpx.AsyncClient(transport=transport, base_url="http://host", timeout=T) as client,
    ):
        h = Http(server, client)
        for kind, value in VALUES.items():
            await _http_input_text(h, value, tallies["input_text"], kind)
            await _http_conversation(h, value, tallies["conversation_id"], kind)
            if not await _http_user(h, value, tallies["user_key"], kind):
                unsendable += 1
            await _http_response_id(h, value, tallies["response_id"], kind)
        plain = "caresp_" + "0123456789abcdefAB" + "x" * 32
        await _http_response_id(h, plain[7:], tallies["response_id"], "plain")
    lines = [record(t, f"http {sql_database.kind} {slot}") for slot, t in tallies.items()]
    wrong = [f"{slot} {w[:300]}" for slot, t in tallies.items() for w in t.wrong]
    assert wrong == [], lines
    assert tallies["input_text"].went_in == tallies["conversation_id"].went_in == len(VALUES), lines
    assert tallies["user_key"].went_in == len(VALUES) - unsendable, lines
    assert tallies["response_id"].went_in == len(VALUES) + 1, lines
    assert tallies["response_id"].came_back_exact >= 1, lines  # a well-formed id round-trips
