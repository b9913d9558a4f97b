"""Several replicas of one guarded server on one database: leases, fencing, cancel relay, reaper.

``GuardedResponses(database=URL, replicas=ReplicaOptions())`` turns it on. Each replica has an
identity (:func:`default_identity`); each response it runs holds a lease row
(``eventguard_leases``: owner, lease expiry by the database's clock, fencing token). See
docs/replicas.md for the seams in the host and README "Several replicas" for the behaviour.
"""

from __future__ import annotations

from eventguard.replicas.identity import default_identity
from eventguard.replicas.options import ReplicaOptions

__all__ = ["ReplicaOptions", "default_identity"]
