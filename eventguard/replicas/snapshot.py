"""GET anywhere: a response in flight on another replica, as of its last stored event.

The owner's host answers ``GET /responses/{id}`` from its live record, which it builds by applying
each event to the response (``ResponseExecution.apply_event`` in the host's ``models/runtime.py``:
a ``response.*`` snapshot event replaces the response, ``response.output_item.added`` appends the
item, ``response.output_item.done`` replaces it at its index). That method belongs to the host's
private execution record (it needs the record's whole state), so it is not reused: :func:`fold`
applies the same rules to the stored envelope, from the events the sink stored for the response's
current attempt (``eventguard_events``: only what the guard verified and let through), and adds the
text the host's own record only shows once an item is done.

What :func:`fold` covers: ``response.output_item.added`` / ``.done``, ``response.content_part.added``
/ ``.done``, ``response.output_text.delta`` / ``.done``. What it does not: the ``response.*``
snapshots (the envelope is the host's own, normalised, version of them: the handler's events carry
the handler's defaults, e.g. ``background: false``, which the host corrects before it stores), any
other delta (refusals, reasoning text and summaries,
function-call arguments, audio, tool-call progress), which shows once its item's
``output_item.done`` is stored; annotations; usage. A terminal event is never folded: the status is
the stored envelope's until the owner's terminal write (under its lease) lands, so every replica
reports an end only once the store has it.

The fold never makes the envelope less complete: an item the envelope already holds (a checkpoint
the host wrote) is replaced only by that item's ``output_item.done``, and deltas are applied only
to items the events themselves added.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.sql.tables import events, responses

#: Statuses of an envelope still in flight (the only ones folded).
IN_FLIGHT = frozenset({"queued", "in_progress"})


def fold(envelope: Mapping[str, Any], stored: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The envelope with the stored events applied (see the module's docstring).

    :param envelope: the stored envelope (not changed: the result is a copy).
    :param stored: the events' payloads, in the guard's order; a payload that is not an object with
        a ``type`` (a redacted or cut one) is skipped.
    """
    snapshot = copy.deepcopy(dict(envelope))
    output = snapshot.get("output")
    if not isinstance(output, list):
        output = []
    held = len(output)  # items the envelope already holds: only their ``done`` replaces them
    for event in stored:
        if not isinstance(event, Mapping):
            continue
        kind = event.get("type")
        index = event.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 10_000:
            continue
        if kind == "response.output_item.done":
            if isinstance(item := event.get("item"), Mapping):
                _place(output, index, copy.deepcopy(dict(item)))
        elif kind == "response.output_item.added":
            if index >= held and isinstance(item := event.get("item"), Mapping):
                _place(output, index, copy.deepcopy(dict(item)))
        elif index >= held and index < len(output) and isinstance(output[index], dict):
            _apply_to_item(output[index], kind, event)
    snapshot["output"] = [item for item in output if item is not None]
    return snapshot


def _place(output: list[Any], index: int, item: dict[str, Any]) -> None:
    while len(output) <= index:
        output.append(None)
    output[index] = item


def _apply_to_item(item: dict[str, Any], kind: object, event: Mapping[str, Any]) -> None:
    """A content part or text event, on the item the events added."""
    part_index = event.get("content_index")
    if not isinstance(part_index, int) or isinstance(part_index, bool) or not 0 <= part_index < 10_000:
        return
    content = item.get("content")
    if not isinstance(content, list):
        content = item["content"] = []
    if kind in ("response.content_part.added", "response.content_part.done"):
        if isinstance(part := event.get("part"), Mapping):
            _place(content, part_index, copy.deepcopy(dict(part)))
        return
    if part_index >= len(content) or not isinstance(content[part_index], dict):
        return
    part_now = content[part_index]
    if kind == "response.output_text.delta" and isinstance(delta := event.get("delta"), str):
        text = part_now.get("text")
        part_now["text"] = (text if isinstance(text, str) else "") + delta
    elif kind == "response.output_text.done" and isinstance(done := event.get("text"), str):
        part_now["text"] = done


async def stored_events(conn: AsyncConnection, shown_id: str) -> list[Any]:
    """The payloads the sink stored for the response's current attempt, in the guard's order.

    :param conn: a connection to the database the sink writes.
    :param shown_id: the response id as the sink stores it.
    """
    r, e = responses.c, events.c
    attempt = select(r.attempt).where(r.response_id == shown_id).scalar_subquery()
    rows = await conn.execute(
        select(e.payload).where(e.response_id == shown_id, e.attempt == attempt).order_by(e.seq)
    )
    return [row.payload for row in rows]
