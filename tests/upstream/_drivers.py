"""Drivers for the real ``ResponsesHostServer``: tapped/guarded subclasses, HTTP and raw-ASGI callers.

The tap and :class:`Seen` are :mod:`eventguard.testing`'s.

Every await here is bounded by ``asyncio.timeout``; a ``TimeoutError`` always propagates.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import httpx
from agent_framework_foundry_hosting import ResponsesHostServer
from packaging.version import Version

from eventguard.testing import TERMINAL_TYPES, Seen, seen, tap

HOSTING_VERSION = metadata.version("agent-framework-foundry-hosting")
RESPONSES_VERSION = metadata.version("azure-ai-agentserver-responses")
# Each behaviour that differs across the supported range is keyed on the package that owns it, at the
# first release where `bash tests/run.sh releases` saw it (every release, with the versions of its date).
#: agent-framework-foundry-hosting before 1.0.0b261002: its handler yields `response.completed` after a
#: client cancel, and `completed` for a model stopped by length or content filter (from 1.0.0b261002:
#: no terminal after a cancel, `incomplete` for those stops).
OLD_RELEASE = Version(HOSTING_VERSION) < Version("1.0.0b261002")
#: azure-ai-agentserver-responses owns resilient background runs. Before 2.3.0b2 its handle_shutdown()
#: sets context.shutdown but not the task context's, so exit_for_recovery() fails the task (seen on
#: 2.2.0b1): no ResponseExitForRecovery reaches the wrapper.
EXITS_FOR_RECOVERY = Version(RESPONSES_VERSION) >= Version("2.3.0b2")
#: ... and before 2.4.0b1 the next process lifetime never re-invokes the interrupted run (seen on
#: 2.3.0b2 and 2.3.0, under hosting 1.0.0b261002 to 1.0.0b261022 alike: the responses package's doing).
REINVOKES_RECOVERED_RUNS = Version(RESPONSES_VERSION) >= Version("2.4.0b1")


def _resume_misses_the_role_gate() -> bool:
    """agent-framework-core 1.26.0 added a required ``role_gate`` argument to the private
    ``WorkflowAgent._convert_workflow_event_to_agent_response_updates``; hosting 1.0.0b261022 (the
    newest on 2026-12-04) still calls it with two, when it resumes a workflow from its checkpoint.
    Probed, not keyed on versions: the pair the resolver picks decides it."""
    from agent_framework import WorkflowAgent
    from agent_framework_foundry_hosting import _responses

    wanted = inspect.signature(WorkflowAgent._convert_workflow_event_to_agent_response_updates).parameters
    resume = getattr(_responses.ResponsesHostServer, "_resume_workflow_from_checkpoint", None)
    if "role_gate" not in wanted or resume is None:
        return False
    return "role_gate" not in inspect.getsource(resume)


#: ... so the recovered run fails in the host (TypeError, reported as ``server_error``) before any
#: output: there is a recovery to observe, and it ends ``failed``.
RESUME_FAILS_UPSTREAM = _resume_misses_the_role_gate()

ENDED_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})

STEP = 20.0  # bound for one step of a scenario (a request, a wait for an executor)


@dataclass
class Run:
    """What one response looked like from inside the server."""

    inner: list[Seen] = field(default_factory=list)  # what the unguarded handler yielded
    forwarded: list[Seen] = field(default_factory=list)  # what the wrapper handed to the host
    guard: Any = None  # the eventguard Guard, when guarded
    context: Any = None
    raised: BaseException | None = None  # what escaped the wrapper, if anything
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # the wrapper generator finished

    def inner_types(self) -> list[str]:
        return [s.type for s in self.inner]

    def forwarded_types(self) -> list[str]:
        return [s.type for s in self.forwarded]

    def inner_terminal(self) -> Seen | None:
        return next((s for s in self.inner if s.type in TERMINAL_TYPES), None)

    def forwarded_terminals(self) -> list[Seen]:
        return [s for s in self.forwarded if s.type in TERMINAL_TYPES]


class Recording:
    """Shared recording of every response a tapped server handled, by response id."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.order: list[str] = []
        self.started = asyncio.Event()

    def new(self, response_id: str) -> Run:
        run = self.runs.get(response_id)
        if run is None:
            run = Run()
            self.runs[response_id] = run
            self.order.append(response_id)
        else:  # a second invocation (recovery, steering drain) of the same id
            fresh = Run()
            self.runs[f"{response_id}#{len(self.order)}"] = run
            self.runs[response_id] = fresh
            self.order.append(response_id)
            run = fresh
        self.started.set()
        return run

    def last(self) -> Run:
        return self.runs[self.order[-1]]


async def drop_terminals(stream: Any) -> AsyncIterator[Any]:
    """An inner stream that ends without a terminal (and with no flag set)."""
    async with aclosing(stream):
        async for event in stream:
            if not (isinstance(event, dict) and event.get("type") in TERMINAL_TYPES):
                yield event


def tapped_server_class(
    recording: Recording,
    *,
    guarded: bool,
    inner_transform: Callable[[Any], Any] | None = None,
    base: type[Any] = ResponsesHostServer,
    **guard_options: Any,
) -> type[Any]:
    """A ``ResponsesHostServer`` subclass that records what its ``_handle_response`` wrapper saw.

    ``guarded=False``: the raw tap (what the unguarded handler yields is what the host gets).
    ``guarded=True``: the explicit ``guard(...)`` form of issue 2, with the Guard captured.
    ``inner_transform`` rewrites the upstream handler's stream before the tap (fault injection).
    """

    class Tapped(base):  # type: ignore[misc, valid-type]
        async def _handle_response(self, request: Any, context: Any, cancellation_signal: Any) -> Any:
            run = recording.new(context.response_id)
            run.context = context
            unguarded = super()._handle_response(request, context, cancellation_signal)
            if inner_transform is not None:
                unguarded = inner_transform(unguarded)
            inner = tap(unguarded, run.inner, cancellation_signal, context)
            try:
                if guarded:
                    from eventguard import guard

                    g = guard(inner, cancellation_signal, context=context, **guard_options)
                    run.guard = g
                    async with g as events:
                        async for event in events:
                            run.forwarded.append(seen(event, cancellation_signal, context))
                            yield event
                else:
                    async for event in inner:
                        run.forwarded.append(seen(event, cancellation_signal, context))
                        yield event
            except BaseException as exc:
                run.raised = exc
                raise
            finally:
                run.closed.set()

    return Tapped


def make_server(cls: type[Any], agent: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("configure_observability", None)
    return cls(agent, **kwargs)


def client_for(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://eventguard.test", timeout=STEP)


def parse_sse(body: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for block in body.split("\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith("data:")]
        if data:
            payload = "\n".join(data)
            if payload and payload != "[DONE]":
                events.append(json.loads(payload))
    return events


async def create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    body.setdefault("input", "go")
    async with asyncio.timeout(STEP):
        return await client.post("/responses", json=body)


async def get_status(client: httpx.AsyncClient, response_id: str) -> str | None:
    async with asyncio.timeout(STEP):
        got = await client.get(f"/responses/{response_id}")
    if got.status_code != 200:
        return None
    return str(got.json().get("status"))


async def wait_status(
    client: httpx.AsyncClient, response_id: str, *, ended: bool = True, within: float = STEP
) -> str | None:
    """Poll ``GET /responses/{id}`` until it reports an ending (or return the last status seen)."""
    status: str | None = None
    async with asyncio.timeout(within):
        while True:
            status = await get_status(client, response_id)
            if not ended or status in ENDED_STATUSES:
                return status
            await asyncio.sleep(0.05)


async def wait_for(event: asyncio.Event, within: float = STEP) -> None:
    async with asyncio.timeout(within):
        await event.wait()


async def wait_until(predicate: Callable[[], bool], within: float = STEP) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - polls state owned by the host
            await asyncio.sleep(0.01)


@dataclass
class AsgiCall:
    """A raw ASGI request whose client can disconnect at a chosen moment."""

    status: int | None = None
    body: bytearray = field(default_factory=bytearray)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    disconnect: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


async def asgi_post_with_disconnect(app: Any, path: str, body: dict[str, Any], call: AsgiCall) -> None:
    """POST ``body`` to ``app`` through raw ASGI; ``call.disconnect.set()`` makes the client go away.

    ``receive()`` first returns the request body, then blocks until ``call.disconnect`` is set and
    then returns ``http.disconnect`` (as a real server does when the socket closes).
    """
    raw = json.dumps(body).encode()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        if not call.disconnect.is_set():
            await call.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            call.status = message["status"]
        elif message["type"] == "http.response.body":
            call.body.extend(message.get("body", b""))
            if not message.get("more_body", False):
                call.finished.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"eventguard.test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("eventguard.test", 80),
    }
    try:
        await app(scope, receive, send)
    except BaseException as exc:  # recorded for the test to inspect, then re-raised
        call.error = exc
        raise
    finally:
        call.finished.set()
