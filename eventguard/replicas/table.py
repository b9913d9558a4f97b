"""The lease table (migration 0005): one row per response id and partition that a replica ran.

Defined with the other tables in :mod:`eventguard.sql.tables` (one ``MetaData``: the migrations
check, and an application's autogenerate keeps it through ``eventguard.include_object``).
"""

from __future__ import annotations

from eventguard.sql.tables import leases

#: The lease states: ``running`` (an owner holds it), ``ended`` (a terminal was written by the
#: holder of the token, or by the reaper), ``interrupted`` (reaped, left for the owner's restart),
#: ``deleted`` (the response was deleted, or nothing was stored under the id: a POST the host
#: refused, a ``store=false`` run; the id may be created again).
STATES = ("running", "ended", "interrupted", "deleted")

__all__ = ["STATES", "leases"]
