"""The settings of a replica (leases, heartbeat, reaper, cancel relay)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from eventguard import _arguments as arguments


@dataclasses.dataclass(frozen=True)
class ReplicaOptions:
    """How one replica holds and gives up its responses.

    - ``identity``: this replica's name in the lease rows (default :func:`default_identity`).
    - ``lease``: seconds a lease lasts without a heartbeat (the database's clock decides).
    - ``heartbeat``: seconds between renewals (default a third of ``lease``; shorter than ``lease``);
      one statement renews every lease of this replica.
    - ``reap_every``: seconds between reaper passes (default half of ``lease``), each with up to
      ``jitter`` (0 to 1) of that added at random, so replicas do not reap in lockstep.
    - ``reap_policy``: how an expired lease's response ends: ``"failed"`` (cause ``owner_lost``;
      default) or ``"interrupted"`` (the lifecycle only: the envelope is left for a restart of the
      owner to recover, as upstream's process-local task store requires).
    - ``cancel_poll``: seconds between looks for relayed cancels (the fallback beside PostgreSQL's
      ``LISTEN/NOTIFY``; the only way on SQLite).
    - ``cancel_wait``: seconds a relaying replica waits for the owner's terminal, counted from the
      owner's taking the cancel (the host's own cancel wait is 10 s, from its receiving it; the
      default adds the terminal's write), and as long again for the owner to take it.
    - ``settle_wait``: seconds at most a run's lease is kept (renewed under its token) after its
      handler ended, for the host's terminal write, while the stored envelope is still in flight or,
      the host storing the response, not written yet (default six times ``lease``); then the lease
      is ended. A ``store=false`` response's lease ends with its handler.
    """

    identity: str | None = None
    lease: float = 10.0
    heartbeat: float | None = None
    reap_every: float | None = None
    jitter: float = 0.5
    reap_policy: Literal["failed", "interrupted"] = "failed"
    cancel_poll: float = 0.5
    cancel_wait: float = 12.0
    settle_wait: float | None = None

    def __post_init__(self) -> None:
        # Each checked here, naming it: a nan or a string would fail later, in a background task.
        arguments.seconds("lease", self.lease, zero=False)
        arguments.seconds("heartbeat", self.heartbeat, zero=False, none=True)
        arguments.seconds("reap_every", self.reap_every, zero=False, none=True)
        arguments.fraction("jitter", self.jitter)
        arguments.seconds("cancel_poll", self.cancel_poll, zero=False)
        arguments.seconds("cancel_wait", self.cancel_wait)
        arguments.seconds("settle_wait", self.settle_wait, none=True)
        # A lease renewed less often than it lasts expires between renewals: the reapers of the
        # other replicas would end this replica's live runs as owner_lost.
        if self.heartbeat_every >= self.lease:
            raise ValueError(
                f"heartbeat must be shorter than lease ({self.heartbeat_every!r} >= {self.lease!r} seconds)"
            )
        if self.jitter > 1:  # up to twice the interval between passes; more would all but stop reaping
            raise ValueError(f"jitter must be a share from 0 to 1 of reap_every, not {self.jitter!r}")
        if self.reap_policy not in ("failed", "interrupted"):
            raise ValueError(f"reap_policy must be 'failed' or 'interrupted', not {self.reap_policy!r}")
        if self.identity is not None:
            _check_identity(self.identity)

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 3

    @property
    def reap_interval(self) -> float:
        return self.reap_every if self.reap_every is not None else self.lease / 2

    @property
    def settle_within(self) -> float:
        return self.settle_wait if self.settle_wait is not None else 6 * self.lease


def _check_identity(identity: object) -> None:
    """The identity is stored as the lease rows' ``owner`` (``VARCHAR(255)``, compared as text on
    every write): refuse what the database would refuse, or store changed, at the first write."""
    if not isinstance(identity, str) or not 0 < len(identity) <= 255:
        raise ValueError(f"identity must be a string of 1 to 255 characters, not {identity!r:.80}")
    # isprintable() is False for a lone surrogate too (category Cs), which no driver could send.
    if not identity.isprintable():
        raise ValueError(
            "identity must be printable text (no NUL, escape, control or lone surrogate), "
            f"not {identity!r:.80}"
        )
