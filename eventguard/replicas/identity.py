"""Who a replica is in the lease rows."""

from __future__ import annotations

import os
import socket
import uuid


def default_identity() -> str:
    """``host:pid:random``: unique per process lifetime (a restarted replica is a new owner, so it
    never mistakes a lease of its previous life for its own)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
