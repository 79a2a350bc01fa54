"""A generated block of a docs page, between two marker lines: read it, or put a new one in its place."""

from __future__ import annotations

from pathlib import Path


def current_block(text: str, begin: str, end: str) -> str:
    """The block in a page's text (markers included), or "" when the page has no markers."""
    start, stop = text.find(begin), text.find(end)
    return text[start : stop + len(end)] if 0 <= start < stop else ""


def with_block(text: str, new: str, begin: str, end: str, page: Path) -> str:
    """`text` with its block replaced by `new`; a page without the markers is an error naming them."""
    old = current_block(text, begin, end)
    if not old:
        raise ValueError(f"{page} has no generated-block markers ({begin})")
    return text.replace(old, new)
