"""``--load N``: N busy processes competing for the CPU while the parts run.

Each is a Python loop that never sleeps, started before the parts and killed (each by its own
handle) when they end, so the figures show what eventguard costs on a machine with other work.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

#: A busy loop that allocates nothing: it takes CPU time and leaves memory and the disk alone.
BUSY = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``n`` busy processes for the duration of the block (none when ``n`` is 0)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(max(n, 0))]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
