"""The documentation site's Markdown (docs/), read by the tests that tie a page's statements to the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml as mkdocs reads it, with a `!!python/name:` tag (a function mkdocs imports) kept as its name."""


_MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def mkdocs_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_MkdocsLoader)  # noqa: S506 (a SafeLoader)


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists, in order, relative to docs/."""

    def walk(items: list) -> list[str]:
        found: list[str] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += walk(value) if isinstance(value, list) else [value]
        return found

    return walk(mkdocs_config()["nav"])


def page(name: str) -> str:
    return (DOCS / name).read_text()


def all_pages() -> str:
    return "\n".join(page(name) for name in nav_pages())


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every Markdown heading outside fenced code."""
    found, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"(#+) (.*)", line)):
            found.append((len(match[1]), match[2].strip()))
    return found


def section(title: str) -> str:
    """A section of whichever page holds the heading `title`, up to the next heading of its level or above
    (a `#` line inside fenced code is a shell comment, not a heading)."""
    for name in nav_pages():
        lines, fence, start, level = page(name).splitlines(keepends=True), False, None, 0
        for number, line in enumerate(lines):
            if line.startswith("```"):
                fence = not fence
            elif not fence and (match := re.match(r"(#+) (.*)", line)):
                if start is not None and len(match[1]) <= level:
                    return "".join(lines[start:number])
                if start is None and match[2].strip() == title:
                    start, level = number, len(match[1])
        if start is not None:
            return "".join(lines[start:])
    raise AssertionError(f"no page has the heading {title!r}")


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading: lower case, words joined by hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def build_site(folder: Path) -> Path:
    """The docs site as `make docs` builds it, strictly (a broken link or a page outside the nav fails), into
    `folder`."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return folder
