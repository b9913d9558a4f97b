"""``eventguard demo``: five real responses through a guarded ``ResponsesHostServer``, no model.

:func:`run_demo` serves each scenario of :mod:`eventguard.demo.scenarios` on loopback, guarded by
:mod:`eventguard.foundry` with :func:`eventguard.testing.tap` below the guard, calls it with the
``openai`` client, and returns a :class:`DemoResult`: per response, what the unguarded handler
yielded, what eventguard recorded and what the public API reports. The command prints it.
"""

from eventguard.demo.runner import DemoResult, Observed, Row, lies, run_demo, upstream_versions
from eventguard.demo.scenarios import SCENARIO_TITLES

__all__ = ["SCENARIO_TITLES", "DemoResult", "Observed", "Row", "lies", "run_demo", "upstream_versions"]
