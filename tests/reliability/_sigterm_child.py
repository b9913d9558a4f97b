"""Child process of the SIGTERM fault: the real server, run the way production runs it.

``server.run()`` is Hypercorn with the host's own SIGTERM handler (its pre-shutdown callbacks, then a
graceful drain, then the lifespan's shutdown). The server is the fault matrix's (``_host.MatrixServer``:
guarded, with a tap above the guard and an injector below it) with a sink on the given database.

Usage: python -m tests.reliability._sigterm_child DB_URL SCHEMA|- SPOOL PORT POSITION
Prints ``REACHED <response_id>`` when the inner stream reaches POSITION (it then waits, as a model would
between chunks, until the cancellation signal is set, at most 20 s), and once ``server.run()`` has returned
one line ``DONE <json>``: the event types the guard forwarded, how often the inner stream was finalised
and closed, and the guard's ending.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from eventguard import SqlSink
from eventguard.testing import ScriptedChatClient, chat_agent

from . import _host


def main(url: str, schema: str, spool: str, port: int, position: int) -> None:
    sink = SqlSink(url, schema=None if schema == "-" else schema, spool_path=spool, flush_interval=0.01)
    agent, _ = chat_agent(ScriptedChatClient(tuple(f"c{i} " for i in range(_host.CHUNKS))))
    server = _host.build(agent, sink, cancel_grace=2.0)
    server.fault_at = position

    async def pause(_context: Any, signal: asyncio.Event) -> None:
        print(f"REACHED {server.response_id}", flush=True)
        try:
            async with asyncio.timeout(20):
                await signal.wait()
        except TimeoutError:
            print("NOSIGNAL", flush=True)

    server.fault = pause
    server.run(host="127.0.0.1", port=port)
    g = server.guard_for(server.response_id) if server.response_id else None
    done = {
        "forwarded": [_host.event_type(e) for e in server.forwarded],
        "finalised": server.finalised,
        "inner_closed": g.inner_closed if g is not None else None,
        "state": g.lifecycle.state.value if g is not None else None,
        "client_cancelled": server.client_cancelled,
        "spooled": sink.stats.batches_spooled,
    }
    print("DONE " + json.dumps(done), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
