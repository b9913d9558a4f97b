"""Child process of the provider's end-to-end tests: one lifetime of a guarded server whose response
store and sink are one SQL database (``GuardedResponsesHostServer(agent, database=URL)``).

Usage: python -m tests.upstream._provider_child URL SCHEMA|- PORT RUNNER AGENT

RUNNER is ``uvicorn`` (``uvicorn.Server``, which handles SIGTERM itself) or ``run`` (the host's own
``server.run()``: Hypercorn with the host's SIGTERM handler). AGENT ``chat`` is a chat agent over a
scripted client that answers ``"seen <n>"``, n the number of messages the host gave it (its history,
from the host's store, then the input: a turn chained on, or in the conversation of, a response of an
earlier lifetime shows what the store served); ``hang`` is a chat agent that streams one chunk and then
waits until the process stops; ``first`` and ``second`` are a one-executor
workflow that answers ``"echo: <input> (done)"``, except that in the ``first`` lifetime an input
starting with ``stuck`` streams one chunk and then waits (a slow model) until the process stops.
(A workflow's own checkpoints live in process memory, so a workflow turn cannot chain across a
restart: that is the workflow's store, not the response store.) The workflow server is resilient
(``resilient_background=True``; the host allows that for workflow agents only), so a background
run stopped by shutdown is recovered by the next lifetime, which reads it back from the response
store.

Prints ``CLOSED <json>`` once the lifespan has closed the storage (whether the sink is closed,
what it spooled), and ``DONE`` when the server has returned (``server.run()`` only: uvicorn ends the
process by re-raising the SIGTERM it handled).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agent_framework import Executor, Message, WorkflowBuilder, WorkflowContext, handler
from azure.ai.agentserver.responses import ResponsesServerOptions

from eventguard.foundry import GuardedResponsesHostServer
from eventguard.testing import ScriptedChatClient, chat_agent, text_update

LONG = 3600.0


class Counting(ScriptedChatClient):
    """Answers ``seen <n>``: how many messages the host gave the agent (its history, then the input)."""

    def _inner_get_response(self, *, messages: Any, stream: bool, options: Any, **kwargs: Any) -> Any:
        self._chunks = ("seen", f" {len(messages)}")
        return super()._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


class Echo(Executor):
    """Answers ``echo: <input>``; in the first lifetime, ``stuck...`` waits after its first chunk."""

    def __init__(self, lifetime: str) -> None:
        super().__init__(id="echo")
        self._lifetime = lifetime

    @handler
    async def run(self, messages: list[Message], ctx: WorkflowContext[Any, Any]) -> None:
        text = messages[-1].text if messages else ""
        message_id = f"msg_echo_{len(messages)}"
        await ctx.yield_output(text_update(f"echo: {text}", message_id=message_id))
        if text.startswith("stuck") and self._lifetime == "first":
            print("STUCK", flush=True)
            await asyncio.sleep(LONG)
        await ctx.yield_output(text_update(" (done)", message_id=message_id))


def say_when_closed(storage: Any) -> None:
    """Print ``CLOSED <json>`` (whether the sink is closed, what it spooled) once the lifespan has
    closed ``storage`` (the server's ``eventguard_storage``); the replica child says it too."""
    close = storage.aclose

    async def closing() -> None:
        # uvicorn re-raises the SIGTERM it handled once it has shut down, so the process ends by
        # the signal: say here, from the lifespan's end, that the storage was closed first.
        await close()
        sink = storage.sink
        assert sink is not None
        closed = {"sink_closed": sink.closed, "spooled": sink.stats.batches_spooled}
        print("CLOSED " + json.dumps(closed), flush=True)

    storage.aclose = closing


def main(url: str, schema: str, port: int, runner: str, which: str) -> None:
    if which == "chat":
        agent, _probe = chat_agent(Counting(), name="counting-chat")
    elif which == "hang":
        hanging = ScriptedChatClient(("one chunk", "never"), hang_after=1)
        agent, _probe = chat_agent(hanging, name="hanging-chat")
    else:
        agent = WorkflowBuilder(start_executor=Echo(which)).build().as_agent(name="echo")
    server = GuardedResponsesHostServer(
        agent,
        database=url,
        schema=None if schema == "-" else schema,
        # Resilience is for workflow agents only (the host refuses it for a chat agent).
        options=ResponsesServerOptions(
            resilient_background=which in ("first", "second"), shutdown_grace_period_seconds=2
        ),
        configure_observability=None,
    )
    storage = server.eventguard_storage
    assert storage is not None and storage.sink is not None
    say_when_closed(storage)

    if runner == "run":
        server.run(host="127.0.0.1", port=port)
    else:
        import uvicorn

        uvicorn.run(server, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
