"""``--runs K``: the same parts K times; the table keeps each figure's worst run.

"Worst" is the run furthest from its target's side: the lowest of a ``>=`` figure, the highest of a
``<=`` one (by ratio, or by value for an absolute bound). A reported-only figure keeps its median run.
A figure skipped in any run stays skipped.
"""

from __future__ import annotations

import dataclasses

from ._common import Row


def _score(r: Row) -> float:
    # A figure without a baseline (the unguarded server's own responses/s, say) has no ratio: its
    # value is what its runs are compared by. Scored NaN, its runs would sort in no order at all.
    v = r.value if r.absolute or r.ratio is None else r.ratio
    return float("nan") if v is None else v


def worst(runs: list[list[Row]]) -> list[Row]:
    """One row per figure (in the first run's order): its worst run, noted with the spread over runs."""
    if len(runs) == 1:
        return runs[0]
    by_key: dict[tuple[str, str], list[Row]] = {}
    for rows in runs:
        for r in rows:
            by_key.setdefault((r.item, r.what), []).append(r)
    out: list[Row] = []
    for same in by_key.values():
        skipped = [r for r in same if r.skipped]
        if skipped:
            out.append(skipped[0])
            continue
        ordered = sorted(same, key=_score)
        if same[0].direction == ">=":
            pick = ordered[0]
        elif same[0].direction == "<=":
            pick = ordered[-1]
        else:
            pick = ordered[len(ordered) // 2]
        kind = "worst" if same[0].direction else "median"
        scores = [_score(r) for r in same]
        note = f"{kind} of {len(same)} runs (all: {', '.join(f'{s:.3g}' for s in scores)})"
        note = f"{note}; {pick.note}" if pick.note else note
        out.append(dataclasses.replace(pick, note=note))
    return out
