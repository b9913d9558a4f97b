"""The fold behind GET anywhere (``eventguard.replicas.snapshot.fold``): the stored events applied
to the stored envelope, never less complete than the envelope, and hostile payloads skipped."""

from __future__ import annotations

import copy
from typing import Any

from eventguard.replicas.snapshot import fold

ENVELOPE: dict[str, Any] = {"id": "resp_1", "status": "in_progress", "background": True, "output": []}
ITEM = {"id": "msg_1", "type": "message", "status": "in_progress", "content": []}
PART = {"type": "output_text", "text": ""}
DELTA = "response.output_text.delta"


def _events(*deltas: str) -> list[dict[str, Any]]:
    return [
        {"type": "response.created", "response": {**ENVELOPE, "background": False}},
        {"type": "response.output_item.added", "output_index": 0, "item": ITEM},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0, "part": PART},
        *({"type": DELTA, "output_index": 0, "content_index": 0, "delta": d} for d in deltas),
    ]


def test_items_parts_and_text_deltas_are_folded_onto_the_envelope_which_keeps_its_own_fields() -> None:
    before = copy.deepcopy(ENVELOPE)
    got = fold(ENVELOPE, _events("a", "b"))
    assert before == ENVELOPE  # a copy: the stored envelope is not changed
    assert got["output"][0]["content"][0]["text"] == "ab"
    assert got["background"] is True and got["status"] == "in_progress"  # snapshots are not folded


def test_a_terminal_event_does_not_end_the_folded_response() -> None:
    done = {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": []}}
    assert fold(ENVELOPE, [*_events("a"), done])["status"] == "in_progress"


def test_an_item_the_envelope_holds_is_replaced_only_by_its_done() -> None:
    held = {**ITEM, "content": [{"type": "output_text", "text": "abc"}]}
    envelope = {**ENVELOPE, "output": [held]}
    assert fold(envelope, _events("a"))["output"] == [held]  # stale added/deltas: the checkpoint stays
    final = {**ITEM, "status": "completed", "content": [{"type": "output_text", "text": "abcd"}]}
    done = {"type": "response.output_item.done", "output_index": 0, "item": final}
    assert fold(envelope, [*_events("a"), done])["output"] == [final]


def test_hostile_or_cut_payloads_are_skipped_without_raising() -> None:
    hostile: list[Any] = [
        None, "text", 7, [], {"type": None}, {"no": "type"},
        {"type": "response.output_item.added", "output_index": True, "item": ITEM},
        {"type": "response.output_item.added", "output_index": "0", "item": ITEM},
        {"type": "response.output_item.added", "output_index": -1, "item": ITEM},
        {"type": "response.output_item.added", "output_index": 10**12, "item": ITEM},
        {"type": "response.output_item.added", "output_index": 0, "item": "not an item"},
        {"type": DELTA, "output_index": 0, "content_index": 0, "delta": "orphan"},
        {"type": "response.output_item.added", "output_index": 0, "item": {**ITEM, "content": "not a list"}},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 10**9, "part": PART},
        {"type": DELTA, "output_index": 0, "content_index": 0, "delta": 5},
        {"type": DELTA, "output_index": 0, "content_index": 0, "delta": "\x00\ud800\x1b[31m"},
    ]  # fmt: skip
    got = fold({**ENVELOPE, "output": "not a list"}, hostile)
    assert got["output"] == [{**ITEM, "content": []}]  # the one well-formed item; the orphan delta dropped
