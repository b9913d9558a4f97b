"""A griffe extension for the API reference (mkdocs.yml): Sphinx roles in docstrings as code.

eventguard's docstrings name other objects the Sphinx way (:class:`~eventguard.State`, as ``help()``
and IDEs show them); Markdown has no roles, so each becomes inline code with the text Sphinx would
show: the last part after a ``~``, the title of ``title <target>``, else the target.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`([^`]+)`")


def _shown(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    titled = re.fullmatch(r"(.+?)\s*<([^>]+)>", target)
    if titled:
        return f"`{titled.group(1)}`"
    if target.startswith("~"):
        return f"`{target[1:].rsplit('.', 1)[-1]}`"
    return f"`{target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring griffe loads (the sources are not touched)."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None and ":`" in obj.docstring.value:
            obj.docstring.value = _ROLE.sub(_shown, obj.docstring.value)
