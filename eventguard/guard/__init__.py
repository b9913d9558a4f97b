"""The guard: an async-iterator combinator that decides a response stream's terminal by its cause.

- ``core``: :class:`Guard`, its protocols, the hot loop and the ending.
- ``options``: :class:`GuardOptions`, the one frozen options object.
- ``host``: the host adapter, the only reader of the host's context (flags at a moment, waiting for
  a cause, what the host says about the response).
- ``owner``: the owner of the inner stream (closed once, in the call or in the background).
- ``watchdog``: the search for the task inside the guard's step, which a stuck-stream cancel interrupts.
"""

from __future__ import annotations

from eventguard.guard.core import Guard, guard
from eventguard.guard.host import CancellationSignal, info_from_context
from eventguard.guard.options import GuardOptions

__all__ = ["CancellationSignal", "Guard", "GuardOptions", "guard", "info_from_context"]
