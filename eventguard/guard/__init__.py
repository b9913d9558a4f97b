"""The guard: an async-iterator combinator that decides a response stream's terminal by its cause.

- ``core``: :func:`guard`; :class:`Guard`, the facade (its protocols), over the core that the hot
  loop's generator holds (the parts, the hot loop, the ending); :class:`~eventguard.guard.core.Phase`.
- ``referee``: the I/O-free core: lifecycle events, terminals, anomalies (one path), synthesised terminals.
- ``inner``: the inner stream, closed once (in the call or in the background), and the background
  work a guard leaves behind, kept alive until it ends.
- ``watchdog``: its task, the search for the task inside the guard's step, the stuck-stream cancel and
  its take-back.
- ``host``: the host adapter, the only reader of the host's context (flags at a moment, waiting for
  a cause, what the host says about the response, whether a run can be recovered).
- ``options``: :class:`GuardOptions`, the one frozen options object.
- ``flush``: the final flush to the recorder, shielded and bounded in time.
- ``loop``: the event loop a guard is bound to (built in, iterated in).

Every policy lives in ``eventguard.decision``.
"""

from __future__ import annotations

from eventguard.guard.core import Guard, guard
from eventguard.guard.host import CancellationSignal, info_from_context
from eventguard.guard.options import GuardOptions

__all__ = ["CancellationSignal", "Guard", "GuardOptions", "guard", "info_from_context"]
