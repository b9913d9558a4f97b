"""The ASGI middleware of a replica: requests about another replica's response, answered as the
owner would answer them (see docs/replicas.md for the host's routes it stands in front of).

- ``POST /responses`` with a client-chosen id (``x-agent-response-id``, else the body's
  ``response_id``, each as the host resolves it): the id is claimed in the database first; taken
  (live elsewhere, or stored): the host's own 409 ``response_id_conflict``. A claim whose POST the
  host refuses before its handler runs (an error status) is let go again.
- ``GET /responses/{id}`` of a *foreground* response in flight on another live replica: the owner's
  404 (the host shows a foreground response only once it has ended).
- ``GET /responses/{id}?stream=true`` (replay) of a background streamed response another replica
  ran or runs (not cancelled): a 400 that says so (:data:`REPLAY_ELSEWHERE`). The replay lives in
  the owner's process-local stream store; the stored events do not reproduce it faithfully (see
  docs/replicas.md, "Replay anywhere").
- ``DELETE /responses/{id}`` of a response running on another live replica: the owner's 400
  "Cannot delete an in-flight response.".
- ``POST /responses/{id}/cancel`` of a response running on another live replica: the cancel is
  recorded and relayed to the owner; this replica waits (the host's own bound) for the lease to end,
  then lets the host answer from the store (200 with the cancelled response).

Everything else, and every request about a response this replica owns or nobody runs, goes to the
host unchanged. A request the relay itself makes to its own host carries :data:`RELAYED`.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventguard.replicas.replica import Replica

#: The header the host reads a client-chosen response id from, and its user partition header.
RESPONSE_ID_HEADER = "x-agent-response-id"
USER_ID_HEADER = "x-agent-user-id"
#: Marks a request the relay makes to its own host (passes through untouched).
RELAYED = "x-eventguard-relayed"

_ONE = re.compile(r"^(?P<prefix>.*)/responses/(?P<id>[^/]+)(?P<cancel>/cancel)?$")


def _error(status: int, message: str, kind: str, code: str | None) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": kind, "code": code, "param": "response_id"}}
    return status, json.dumps(body).encode()


CONFLICT = _error(
    409,
    "An active execution or retained replay stream with this response ID already exists.",
    "conflict",
    "response_id_conflict",
)
IN_FLIGHT = _error(400, "Cannot delete an in-flight response.", "invalid_request_error", None)
#: A replay (``?stream=true``) asked of a replica that did not run the response: the host's own
#: status, type and ``param`` for a stream it cannot serve, with a message that says why (its
#: answer here, "not created with stream=true or the stream TTL has expired", is not so).
REPLAY_ELSEWHERE = (
    400,
    json.dumps(
        {
            "error": {
                "message": "This response was streamed by another replica: its events can be replayed "
                "(stream=true) only by the replica that ran it, while it retains them. "
                "Retrieve it without stream=true for its stored state.",
                "type": "invalid_request_error",
                "code": "invalid_request_error",
                "param": "stream",
            }
        }
    ).encode(),
)


def _not_found(response_id: str) -> tuple[int, bytes]:
    body = {
        "error": {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "code": "invalid_request_error",
            "param": "response_id",
        }
    }
    return 404, json.dumps(body).encode()


class ReplicaMiddleware:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app: Any, replica: Replica) -> None:
        self.app = app
        self.replica = replica

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not self.replica.started:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if RELAYED in headers:
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", ""), scope.get("path", "")
        user = headers.get(USER_ID_HEADER)
        if method == "POST" and path.endswith("/responses"):
            response_id = _chosen_id(headers.get(RESPONSE_ID_HEADER, ""))
            if response_id is None:
                # The host takes a client-chosen id from the body too: unclaimed, a second replica
                # ran it over the first's live response.
                body, receive = await _read_body(receive)
                response_id = _body_id(body)
                del body  # the host reads it from the replayed messages; not kept for the stream
            if response_id is None:
                await self.app(scope, receive, send)  # the host makes the id: nobody else has it
                return
            if not await self.replica.claim_id(response_id, user):
                await _answer(send, *CONFLICT)
                return
            status: list[int] = []

            async def watched(message: Any) -> None:
                if message.get("type") == "http.response.start":
                    status.append(int(message.get("status", 0)))
                await send(message)

            try:
                await self.app(scope, receive, watched)
            finally:
                if not status or status[0] >= 400:
                    await self.replica.release_unrun(response_id, user)
            return
        elif (match := _ONE.match(path)) is not None:
            from urllib.parse import unquote

            response_id = unquote(match["id"])
            query = _query(scope)
            replay = query.get("stream", "false").lower() == "true"  # as the host reads it
            if method == "GET" and match["cancel"] is None and not replay:
                if await self.replica.foreground_elsewhere(response_id, user):
                    await _answer(send, *_not_found(response_id))
                    return
            elif method == "GET" and match["cancel"] is None:
                if _cursor_ok(query) and await self.replica.replay_elsewhere(response_id, user):
                    await _answer(send, *REPLAY_ELSEWHERE)
                    return
            elif method == "DELETE" and match["cancel"] is None:
                if await self.replica.running_elsewhere(response_id, user):
                    await _answer(send, *IN_FLIGHT)
                    return
            elif method == "POST" and match["cancel"] is not None:
                await self.replica.relay_cancel(response_id, user, headers)
        await self.app(scope, receive, send)


def _headers(scope: Any) -> dict[str, str]:
    """The request's headers as the host's framework reads them: a repeated name's *first* value
    (the relay took the last, so it claimed one id while the host ran another)."""
    out: dict[str, str] = {}
    for k, v in scope.get("headers", []):
        out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    return out


def _chosen_id(value: object) -> str | None:
    """A client-chosen response id as the host resolves it: a non-blank string, stripped."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


async def _read_body(receive: Any) -> tuple[bytes, Any]:
    """The whole request body, and a ``receive`` that hands it to the host as it came."""
    chunks: list[bytes] = []
    messages: list[Any] = []
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break  # the client went away: the host sees that too
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break

    async def replayed() -> Any:
        return messages.pop(0) if messages else await receive()

    return b"".join(chunks), replayed


def _body_id(body: bytes) -> str | None:
    """The ``response_id`` of a create request's JSON body, as the host reads it when no header
    gives one (Starlette's ``request.json()``: ``json.loads`` of the bytes, which takes a BOM,
    UTF-16 and UTF-32, ``NaN``, an escaped lone surrogate, where orjson does not); None for a body
    the host will refuse or an id it will make itself."""
    if _plainly_without_an_id(body):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return _chosen_id(parsed.get("response_id")) if isinstance(parsed, dict) else None


def _plainly_without_an_id(body: bytes) -> bool:
    """Whether ``body`` cannot hold a ``response_id`` key, seen without parsing it (a large input is
    not parsed a second time): UTF-8 without a BOM (UTF-16 and UTF-32 put a NUL in the first four
    bytes), and neither the key nor a ``\\u`` escape that could spell it."""
    return (
        not body.startswith(codecs.BOM_UTF8)
        and b"\x00" not in body[:4]
        and b"response_id" not in body
        and b"\\u" not in body
    )


def _query(scope: Any) -> dict[str, str]:
    """The query's parameters as the host's framework reads them (blank values kept, the last of
    a repeated name wins)."""
    from urllib.parse import parse_qsl

    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))


def _cursor_ok(query: dict[str, str]) -> bool:
    """``starting_after`` absent or an integer: else the host's own 400 (``param=starting_after``)
    comes first, as on the owner."""
    cursor = query.get("starting_after")
    if cursor is None:
        return True
    try:
        int(cursor)
    except ValueError:
        return False
    return True


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
