"""The API reference (docs/reference, built by ``mkdocs build --strict`` in ``tests/run.sh newest``)
renders every public name: each name of ``eventguard.__all__`` is one ``::: eventguard.NAME`` block.
This test needs no mkdocs; the build itself checks that each block resolves and renders."""

from __future__ import annotations

import re
from pathlib import Path

import eventguard

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "reference"


def _rendered() -> list[str]:
    found: list[str] = []
    for page in sorted(PAGES.glob("*.md")):
        found += re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return found


def test_every_public_name_has_its_block_in_the_api_reference() -> None:
    blocks = _rendered()
    missing = [name for name in eventguard.__all__ if f"eventguard.{name}" not in blocks]
    assert missing == []
    assert len(blocks) == len(set(blocks)), "a name rendered twice"


def test_every_reference_page_is_in_the_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")  # no YAML parser in every venv
    assert re.search(r"^docs_dir: docs/reference$", config, flags=re.MULTILINE)
    listed = set(re.findall(r"^  - [^:]+: (\S+\.md)$", config, flags=re.MULTILINE))
    assert listed == {page.name for page in PAGES.glob("*.md")}
