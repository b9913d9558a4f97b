"""The replica relay reads a client-chosen response id as the host resolves it (its
``_resolve_identity_fields``): the header's first value, stripped, else the body's ``response_id``,
however the JSON spells the key. What it misreads, it does not claim, and a second replica runs
the same id over the first's live response (tests/upstream/test_replicas.py has the real one)."""

from __future__ import annotations

import asyncio
import codecs
import json
from typing import Any

import pytest

from eventguard.replicas.relay import _body_id, _headers, _read_body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (json.dumps({"model": "m", "response_id": "  caresp_x  "}).encode(), "caresp_x"),
        (b'{"response\\u005fid": "caresp_escaped"}', "caresp_escaped"),  # json.loads reads it so
        (json.dumps({"response_id": "caresp_\u00e9"}, ensure_ascii=True).encode(), "caresp_\u00e9"),
        # Starlette's request.json() (json.loads) takes these, and so the host runs their id:
        (codecs.BOM_UTF8 + b'{"response_id": "caresp_bom"}', "caresp_bom"),
        ('{"response_id": "caresp_utf16"}'.encode("utf-16"), "caresp_utf16"),
        ('{"response_id": "caresp_utf32le"}'.encode("utf-32-le"), "caresp_utf32le"),
        (b'{"temperature": NaN, "response_id": "caresp_nan"}', "caresp_nan"),
        (b'{"input": "\\ud800", "response_id": "caresp_surrogate"}', "caresp_surrogate"),
        (json.dumps({"model": "m", "input": "hi"}).encode(), None),
        (json.dumps({"response_id": "   "}).encode(), None),  # blank: the host makes one
        (json.dumps({"response_id": 5}).encode(), None),
        (b'{"response_id": "x"', None),  # not JSON: the host refuses it
        (b"[1, 2]", None),
        (b"", None),
    ],
)
def test_the_bodys_response_id_is_read_as_the_host_reads_it(body: bytes, expected: str | None) -> None:
    assert _body_id(body) == expected


def test_of_a_repeated_header_the_first_value_counts() -> None:
    scope = {"headers": [(b"X-Agent-Response-Id", b"first"), (b"x-agent-response-id", b"second")]}
    assert _headers(scope)["x-agent-response-id"] == "first"


async def test_the_body_read_is_handed_to_the_host_as_it_came() -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"a": ', "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent = list(messages)

    async def receive() -> dict[str, Any]:
        return sent.pop(0)

    async with asyncio.timeout(5):
        body, replayed = await _read_body(receive)
        assert body == b'{"a": 1}'
        assert [await replayed() for _ in range(3)] == messages
