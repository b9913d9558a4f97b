"""The mixin learns that the process is shutting down, on every path the host offers.

The host tells foreground responses about shutdown through their context, never background ones; the
process then cancels what still runs. The guards must see that exit as shutdown, not as a cancel.
(SIGTERM under ``server.run()`` is driven in a real process by tests/reliability/test_sigterm.py.)
"""

from __future__ import annotations

import asyncio

import pytest

from eventguard.foundry import GuardedResponsesHostServer
from eventguard.testing import ScriptedChatClient, chat_agent

pytestmark = [pytest.mark.upstream]


class Server(GuardedResponsesHostServer):
    cleaned = 0

    async def _cleanup_agent(self) -> None:
        type(self).cleaned += 1
        await super()._cleanup_agent()


def build(**kwargs: object) -> Server:
    agent, _ = chat_agent(ScriptedChatClient(("a ", "b ")))
    return Server(agent, configure_observability=None, **kwargs)


async def test_request_shutdown_is_seen_by_the_guards_and_still_reaches_the_host() -> None:
    s = build()
    assert not s._eventguard_process_shutdown.is_set()
    s.request_shutdown()
    assert s._eventguard_process_shutdown.is_set()
    assert s._endpoint._shutdown_requested.is_set()


async def test_the_lifespans_shutdown_is_seen_and_the_hosts_own_handler_still_runs() -> None:
    s = build()
    before = Server.cleaned
    async with asyncio.timeout(30):
        async with s.router.lifespan_context(s):
            assert not s._eventguard_process_shutdown.is_set()
    assert s._eventguard_process_shutdown.is_set()
    assert Server.cleaned == before + 1


async def test_the_lifespans_shutdown_is_seen_without_a_graceful_drain_and_with_a_later_handler() -> None:
    # graceful_shutdown_timeout=0 makes the host skip its shutdown handler; a handler registered after
    # construction replaces the host's. Neither hides the exit from the guards.
    s = build(graceful_shutdown_timeout=0)
    later: list[str] = []

    async def mine() -> None:
        later.append("ran")

    s.shutdown_handler(mine)
    async with asyncio.timeout(30):
        async with s.router.lifespan_context(s):
            pass
    assert s._eventguard_process_shutdown.is_set()


async def test_a_new_lifetime_of_the_app_starts_with_the_flag_clear() -> None:
    s = build()
    s.request_shutdown()
    async with asyncio.timeout(30):
        async with s.router.lifespan_context(s):
            assert not s._eventguard_process_shutdown.is_set()


async def test_the_hosts_sigterm_callbacks_tell_the_guards_before_the_drain() -> None:
    # What server.run()'s signal handler calls first on SIGTERM (the subprocess test drives the real
    # signal): the flag is set during Hypercorn's drain, before the lifespan's shutdown, so a background
    # run that fails meanwhile (its model connection cut by the same signal) is recorded as shutdown.
    s = build()
    for callback in s._pre_shutdown_callbacks:
        callback()
    assert s._eventguard_process_shutdown.is_set()
