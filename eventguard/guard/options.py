"""The guard's options: one small frozen value object, as httpx's ``Timeout``.

``guard()`` takes them as keyword arguments (its documented signature) and builds one of these;
:class:`~eventguard.Guard` and ``GuardedResponses`` hold one. The decision table reads three of them
(``on_cancel``, ``keep_shutdown_completion``, ``recoverable``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from eventguard import _arguments as arguments

__all__ = ["GuardOptions"]


@dataclass(frozen=True, slots=True)
class GuardOptions:
    """How a guard behaves: what ``guard()``'s keyword arguments say, as one frozen value (each field
    below). ``GuardedResponses`` builds one from its own arguments and hands it to every guard."""

    #: ``"omit"``: on a client cancel forward no terminal (the host writes the cancel); ``"emit"``: one
    #: ``response.failed`` with status ``cancelled``.
    on_cancel: Literal["omit", "emit"] = "omit"
    #: Seconds the stream gets after a cause is signalled before the watchdog steps in; None: no watchdog.
    cancel_grace: float | None = 10.0
    #: Keep a ``completed`` produced after the host told this response it is shutting down (its
    #: context's ``shutdown``; ``Flags.shutdown``), flagged unverified, instead of failing it.
    keep_shutdown_completion: bool = False
    #: Raise ``InvalidEvent`` / ``IllegalTransition`` on bad input instead of recording an anomaly.
    strict: bool = False
    #: Can a run stopped by shutdown (the host's ``Flags.shutdown`` or the process's
    #: ``Flags.process_shutdown``) be recovered (``interrupted``) or is it lost (``failed``)?
    #: None: the host adapter decides from the context (a stored background run of a resilient host).
    recoverable: bool | None = None
    #: Bound, in seconds, on the final flush to the sink; it goes on in the background after that.
    flush_timeout: float = 5.0

    def check(self) -> None:
        """Refuse values the guard cannot work with (called when a guard is built)."""
        if self.on_cancel not in ("omit", "emit"):
            raise ValueError(f"on_cancel must be 'omit' or 'emit', not {self.on_cancel!r}")
        arguments.seconds("cancel_grace", self.cancel_grace, none=True)
        arguments.seconds("flush_timeout", self.flush_timeout)
        arguments.flag("keep_shutdown_completion", self.keep_shutdown_completion)
        arguments.flag("strict", self.strict)
        arguments.flag("recoverable", self.recoverable, none=True)
