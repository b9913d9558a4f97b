"""The hostile values the suites feed to every column, file and argument, and a tally of what came back.

One list for all: the reliability matrix, the response store's round trips, the lease rows and the
CLI's arguments draw from :data:`STRINGS`; each suite adds only what is peculiar to its subject.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

#: Hostile strings, each with a plain marker around it so the case stays findable.
STRINGS: dict[str, str] = {
    "nul": "a\x00b",
    "lone_surrogate": "a\udcffb",
    "c0_c1_controls": "a\x01\x07\x08\x1f\x7f\x85\x9fb",
    "ansi_escape": "a\x1b[31mred\x1b[0m\x1b]0;title\x07b",
    "rtl_override": "a\u202eevil\u202cb",
    "one_megabyte": "m" * (1 << 20),
}

#: Strings that look like an encoding the stores use themselves (the response store's ``~`` prefix
#: of an escaped id, the sink's ``<prefix>~<hash>``, a backslash escape): they must not be decoded.
LOOKALIKES: dict[str, str] = {
    "tilde_json": '~"x"',
    "tilde_hash": "resp~0123456789abcdef",
    "backslash_escape": "a\\x00\\udcffb",
}


@dataclass
class Tally:
    """What went in and what came out, per outcome: ``exact`` (read back equal), ``refused:<Error>``
    (a typed error at the call), or anything else, which a test fails on."""

    went_in: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)

    def exact(self) -> None:
        self.went_in += 1
        self.outcomes["exact"] += 1

    def refused(self, why: BaseException | str) -> None:
        """Refused at the call: by the error's type, or by a label (``http_400``)."""
        self.went_in += 1
        self.outcomes[f"refused:{why if isinstance(why, str) else type(why).__name__}"] += 1

    def other(self, outcome: str) -> None:
        """Neither exact nor refused, and not wrong either: named (``host_500``, an upstream answer)."""
        self.went_in += 1
        self.outcomes[outcome] += 1

    def bad(self, case: str, what: str) -> None:
        self.went_in += 1
        self.outcomes["wrong"] += 1
        self.wrong.append(f"{case}: {what}")

    @property
    def came_back_exact(self) -> int:
        return self.outcomes["exact"]

    def line(self, area: str) -> str:
        """One line for the log and the report: ``area: N in, N exact, N refused (by error)``."""
        refused = {
            k.split(":", 1)[1]: v for k, v in sorted(self.outcomes.items()) if k.startswith("refused:")
        }
        others = {
            k: v for k, v in sorted(self.outcomes.items()) if k not in ("exact", "wrong") and ":" not in k
        }
        return (
            f"{area}: {self.went_in} in, {self.came_back_exact} exact, {sum(refused.values())} refused "
            f"{refused}, {others}, {self.outcomes['wrong']} wrong"
        )


def record(tally: Tally, area: str) -> str:
    """The tally's line, appended to ``EVENTGUARD_HOSTILE_REPORT`` when that names a file."""
    line = tally.line(area)
    path = os.environ.get("EVENTGUARD_HOSTILE_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return line
