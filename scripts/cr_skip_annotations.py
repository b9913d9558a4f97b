"""cosmic-ray filter: skip mutants inside annotations that Python never evaluates.

In a module with ``from __future__ import annotations`` a function's parameter and return annotations are
stored as strings and never evaluated, and a local variable's annotation is never evaluated at all; a
mutant there (``float | None`` -> ``float - None``) cannot change behaviour, so running the tests on it
only costs time. Class-level annotations are left alone: pydantic and dataclasses evaluate those.

Usage: python scripts/cr_skip_annotations.py SESSION.sqlite   (after ``cosmic-ray init``)
Prints how many mutants it marked skipped; docs/mutation.md counts them as equivalent.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

Span = tuple[tuple[int, int], tuple[int, int]]


@cache
def unevaluated_annotation_spans(path: Path) -> tuple[Span, ...]:
    tree = ast.parse(path.read_text())
    postponed = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )
    spans: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if postponed:
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
                spans += [a.annotation for a in every if a.annotation is not None]
                if node.returns is not None:
                    spans.append(node.returns)
            # A local variable's annotation is never evaluated, future import or not.
            for inner in ast.walk(node):
                if isinstance(inner, ast.AnnAssign):
                    spans.append(inner.annotation)
    return tuple(((e.lineno, e.col_offset), (e.end_lineno or e.lineno, e.end_col_offset or 0)) for e in spans)


def inside(start: tuple[int, int], end: tuple[int, int], spans: tuple[Span, ...]) -> bool:
    return any(lo <= start and end <= hi for lo, hi in spans)


def main(session: str) -> int:
    skipped = 0
    with use_db(session) as db:
        for item in db.work_items:
            if all(
                inside(
                    tuple(m.start_pos), tuple(m.end_pos), unevaluated_annotation_spans(Path(m.module_path))
                )
                for m in item.mutations
            ):
                db.set_result(
                    item.job_id,
                    WorkResult(
                        output="skipped: inside an annotation that is never evaluated",
                        test_outcome=None,
                        diff=None,
                        worker_outcome=WorkerOutcome.SKIPPED,
                    ),
                )
                skipped += 1
    print(f"skipped {skipped} mutants inside never-evaluated annotations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
