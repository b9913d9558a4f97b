"""Child process of the replica tests: one replica of a guarded server on one database
(``GuardedResponsesHostServer(agent, database=URL, replicas=ReplicaOptions(...))``) under uvicorn.

Usage: python -m tests.upstream._replica_child URL SCHEMA|- PORT LEASE [REAP_POLICY [HEARTBEAT REAP_EVERY]]

(``HEARTBEAT`` and ``REAP_EVERY`` in seconds, ``-`` for the defaults: a heartbeat far longer than the
lease stands for an owner whose renewals are late, as under heavy load.)

The agent answers by its input: ``hang...`` streams one chunk and then waits until cancelled (a slow
model); ``slow...`` streams three chunks a second apart; anything else answers ``done`` at once.
Prints ``IDENTITY <name>`` once started and ``CLOSED <json>`` when the lifespan closed the storage.
"""

from __future__ import annotations

import sys
from typing import Any

from azure.ai.agentserver.responses import ResponsesServerOptions

from eventguard.foundry import GuardedResponsesHostServer
from eventguard.replicas import ReplicaOptions
from eventguard.testing import ScriptedChatClient, chat_agent
from tests.upstream._provider_child import say_when_closed


class ByInput(ScriptedChatClient):
    """Hangs, streams slowly or answers at once, by the last message's text (one script per call,
    so concurrent responses do not share one)."""

    def _inner_get_response(self, *, messages: Any, stream: bool, options: Any, **kwargs: Any) -> Any:
        text = messages[-1].text if messages else ""
        if text.startswith("hang"):
            script = ScriptedChatClient(("working", " more"), hang_after=1)
        elif text.startswith("slow"):
            script = ScriptedChatClient(("a", "b", "c"), delay=1.0)
        else:
            script = ScriptedChatClient(("done",))
        return script._inner_get_response(messages=messages, stream=stream, options=options, **kwargs)


def main(
    url: str,
    schema: str,
    port: int,
    lease: float,
    policy: str = "failed",
    heartbeat: str = "-",
    reap: str = "-",
) -> None:
    agent, _probe = chat_agent(ByInput(), name="replica-chat")
    assert policy in ("failed", "interrupted"), policy
    beat = None if heartbeat == "-" else float(heartbeat)
    options = ReplicaOptions(
        lease=lease,
        cancel_poll=0.2,
        jitter=0.5,
        reap_policy=policy,  # type: ignore[arg-type]
        heartbeat=beat if beat is None or beat < lease else None,
        reap_every=None if reap == "-" else float(reap),
    )
    if beat is not None and beat >= lease:
        # A renewal later than the lease, as heavy load makes it: ReplicaOptions refuses it as a
        # setting, so the test sets it on the frozen options directly.
        object.__setattr__(options, "heartbeat", beat)
    server = GuardedResponsesHostServer(
        agent,
        database=url,
        schema=None if schema == "-" else schema,
        replicas=options,
        options=ResponsesServerOptions(shutdown_grace_period_seconds=2),
        configure_observability=None,
    )
    storage = server.eventguard_storage
    assert storage is not None and storage.sink is not None and storage.replica is not None
    print("IDENTITY " + storage.replica.identity, flush=True)
    say_when_closed(storage)
    import uvicorn

    uvicorn.run(server, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:8])
