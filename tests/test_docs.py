"""The README and the documentation site: the strict build, the generated reference pages, and that the
old README's sections all have a home."""

from __future__ import annotations

import itertools
import re

import typer

from config.context import KEYS
from tests.docs_text import DOCS, ROOT, all_pages, build_site, headings, mkdocs_config, nav_pages, page, slug
from tools import architecture, docs_reference, mermaid_svg

README = ROOT / "README.md"


def test_site_builds_strictly(tmp_path):
    # The build `make docs` runs: every warning (a broken link or anchor, a page outside the nav) fails it.
    site = build_site(tmp_path / "site")
    cli = (site / "reference" / "cli" / "index.html").read_text()
    # A pipe inside a code span in a table shows as itself, not as `\|`.
    assert "<code>--since SPAN|DATE</code>" in cli and "\\|" not in cli
    # The home page shows the diagram's committed SVG (tests/test_docs_offline.py); the stylesheet is linked.
    home = (site / "index.html").read_text()
    assert re.search(r'<img alt="The stacks \(Training\w+, [^"]*" src="assets/architecture.svg"', home)
    assert "stylesheets/extra.css" in home
    # Long allowed-value lists are folded on the context-key page.
    keys = (site / "reference" / "context-keys" / "index.html").read_text()
    assert re.search(r'<div class="names">\s*<table>\s*<thead>\s*<tr>\s*<th>key</th>', keys)
    assert re.search(r"<details><summary>none, or EFA-capable NVIDIA GPU types \(\d+\)</summary>g4dn", keys)


def test_strict_mode_covers_links_anchors_and_the_nav():
    config = mkdocs_config()
    assert config["strict"] is True
    validation = config["validation"]
    assert validation["nav"]["omitted_files"] == "warn" and validation["nav"]["not_found"] == "warn"
    assert validation["links"]["not_found"] == "warn" and validation["links"]["anchors"] == "warn"


def test_reference_pages_are_current():
    assert docs_reference.stale() == [], "run `make docs-gen`"
    assert {f"reference/{name}" for name in docs_reference.PAGES} <= set(nav_pages())


def test_a_stale_or_missing_reference_page_is_named(tmp_path, monkeypatch, capsys):
    # The diagram's own synth and content: tests/test_architecture.py; here, that main() writes and checks it.
    index = tmp_path / "index.md"
    index.write_text(f"# Home\n\n{architecture.BEGIN}\nold\n{architecture.END}\n\nAfter.\n")
    monkeypatch.setattr(architecture, "INDEX", index)
    monkeypatch.setattr(architecture, "SOURCE", tmp_path / "architecture.mmd")
    monkeypatch.setattr(architecture, "PICTURE", tmp_path / "architecture.svg")
    monkeypatch.setattr(mermaid_svg, "render", lambda source: "<svg></svg>")
    block = f"{architecture.BEGIN}\nnew\n{architecture.END}"
    monkeypatch.setattr(docs_reference, "architecture_diagram", lambda: ("flowchart LR\n", block))
    monkeypatch.setattr(docs_reference, "REFERENCE", tmp_path / "reference")
    assert docs_reference.main([]) == 0
    assert index.read_text() == f"# Home\n\n{architecture.BEGIN}\nnew\n{architecture.END}\n\nAfter.\n"
    assert docs_reference.stale() == [] and docs_reference.main(["--check"]) == 0
    reference = tmp_path / "reference"
    (reference / "catalog.md").write_text(page("reference/catalog.md").replace("| 3200 |", "| 3100 |", 1))
    (reference / "cli.md").unlink()
    index.write_text(index.read_text().replace("new", "older"))
    assert docs_reference.stale() == ["catalog.md", "cli.md"]
    capsys.readouterr()
    assert docs_reference.main(["--check"]) == 1
    assert "docs/index.md's architecture diagram is stale" in capsys.readouterr().err


def test_key_names_never_break_and_long_lists_fold():
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    assert re.search(r"td code \{\s*word-break: normal;\s*overflow-wrap: normal;", css)
    assert re.search(r"\.names table:not\(\[class\]\) td:first-child code \{\s*white-space: nowrap;", css)
    assert (
        "stylesheets/extra.css" in mkdocs_config()["extra_css"]
        and "md_in_html" in mkdocs_config()["markdown_extensions"]
    )
    for name in docs_reference.PAGES:  # every generated table sits in the names block, and only tables do
        blocks = re.findall(r'<div class="names" markdown>\n\n(.*?)\n\n</div>', page(f"reference/{name}"), re.S)
        assert blocks and all(all(line.startswith("|") for line in block.splitlines()) for block in blocks), name
        assert len(blocks) == len(re.findall(r"^\|---", page(f"reference/{name}"), re.M)), name
    text = page("reference/context-keys.md")
    assert text.startswith("---\nhide:\n  - toc\n---\n")  # the table gets the contents' width
    rows = {row.split(" | ")[0][3:-1]: row.split(" | ")[2] for row in text.splitlines() if row.startswith("| `")}
    for key in KEYS.values():
        if len(key.allowed) > docs_reference.FOLD_OVER:
            assert rows[key.name].startswith("<details><summary>") and rows[key.name].endswith("</details>"), key.name
        else:
            assert "<details>" not in rows[key.name], key.name
    assert rows["gpuInstanceType"].count("<details>") == 1


def test_context_key_page_lists_every_key_with_its_default():
    text = page("reference/context-keys.md")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*?) \|", text, re.M))
    assert set(KEYS) <= set(rows), set(KEYS) - set(rows)
    for key in KEYS.values():
        expected = "none" if key.default in (None, "") else f"`{str(key.default).lower()}`"
        assert rows[key.name].lower() == expected, key.name


def test_cli_page_walks_the_command_tree():
    # A command or a sub-group added to an app shows up in its page, hidden ones do not.
    app = typer.Typer(help="Demo.")
    jobs = typer.Typer(help="Jobs.")
    app.add_typer(jobs, name="jobs")

    @app.command()
    def first(fleet: str = typer.Argument(..., help="Fleet to use.")) -> None:
        """Does the first thing."""

    @jobs.command("tail")
    def tail(follow: bool = typer.Option(False, "--follow", help="Keep going.")) -> None:
        """Tails a job."""

    @app.command(hidden=True)
    def secret() -> None:
        """Hidden."""

    text = docs_reference.cli_page(app)
    assert "## `trainctl first`" in text and "Does the first thing." in text and "Fleet to use." in text
    assert "## `trainctl jobs tail`" in text and "| `--follow` | Keep going. |" in text
    assert "secret" not in text


def test_cli_page_has_every_trainctl_command():
    import typer.main

    from trainctl.cli import app

    group = typer.main.get_command(app)
    text = page("reference/cli.md")
    for name in group.list_commands(group.context_class(group, info_name="trainctl")):
        # A group (`fabric`) is documented by its commands (`trainctl fabric verdict`).
        assert f"## `trainctl {name}`" in text or f"## `trainctl {name} " in text, name


def test_every_old_readme_heading_has_a_home():
    old = [
        line.split(" ", 1)[1] for line in (ROOT / "tests/fixtures/readme_headings_2026-11.txt").read_text().splitlines()
    ]
    assert len(old) == 37
    homes = {text for name in nav_pages() for _, text in headings(page(name))}
    assert [title for title in old if title not in homes] == []


def test_readme_is_short_and_starts_with_the_setup_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    first_screen = "\n".join(lines[:40])
    assert re.search(r"^make synth\b", first_screen, re.M) and re.search(r"^make test\b", first_screen, re.M)


def test_readme_links_into_the_site_resolve():
    links = re.findall(r"\]\(docs/([\w/.-]+\.md)(?:#([\w-]+))?\)", README.read_text())
    assert len({target for target, _ in links}) >= 15
    for target, anchor in links:
        assert (DOCS / target).exists(), target
        if anchor:
            assert anchor in {slug(text) for _, text in headings(page(target))}, (target, anchor)


def test_readme_first_job_uses_the_commands_trainctl_has():
    readme = README.read_text()
    used = set(re.findall(r"^trainctl (\w+)", readme, re.M))
    assert {"check", "submit", "logs"} <= used
    assert all(f"## `trainctl {name}`" in page("reference/cli.md") for name in used), used


def test_docs_text_still_reads_every_page():
    assert "## What it builds" in all_pages() and len(nav_pages()) == len(list(DOCS.rglob("*.md")))


def nav_titles() -> dict[str, str]:
    """Page -> its title in mkdocs.yml's nav."""

    def walk(items: list) -> dict[str, str]:
        found: dict[str, str] = {}
        for item in items:
            title, value = next(iter(item.items()))
            found.update(walk(value) if isinstance(value, list) else {value: title})
        return found

    return walk(mkdocs_config()["nav"])


def test_no_page_repeats_its_title_as_another_heading():
    def plain(text: str) -> str:
        return text.replace("`", "").strip().lower()

    for name, title in nav_titles().items():
        found = headings(page(name))
        assert found and found[0][0] == 1, name
        later = {plain(text) for _, text in found[1:]}
        assert plain(found[0][1]) not in later and plain(title) not in later, name


def test_running_jobs_opens_with_the_walkthrough_and_task_files_have_a_heading():
    found = headings(page("jobs.md"))
    assert found[1] == (2, "From `make deploy` to a running job")
    assert (3, "Task files") in found
    internals = [text for _, text in found].index("What a job definition asks for")
    assert internals > [text for _, text in found].index("trainctl exit status")


# The widest code line the site shows without a sideways scroll. The theme's content column, in a window of
# 1220 px or more (both sidebars shown, as at 1280 px), is 61rem less two 12.1rem sidebars and two 1.2rem
# margins: 688 px at the theme's 20 px rem; a code block's padding (1.18em each side) leaves 656 px, and
# Roboto Mono at the code's 13.6 px (0.85 x 0.8rem) is 8.16 px a character: 80 characters. Inside a list item
# (a fence indented under it), the item's 1.25em (20 px) indent takes 3 more.
CODE_COLUMNS = 80
LIST_INDENT_COLUMNS = 3


def code_blocks(text: str) -> list[tuple[str, list[str], bool]]:
    """(language, lines, whether the fence is indented: inside a list item) of every fenced code block."""
    blocks: list[tuple[str, list[str], bool]] = []
    fence: re.Match[str] | None = None
    for line in text.splitlines():
        if fence is None:
            fence = re.match(r"(\s*)(`{3,})\s*([\w-]*)", line)
            if fence:
                blocks.append((fence[3], [], bool(fence[1])))
        elif line.strip() == fence[2]:
            fence = None
        else:
            blocks[-1][1].append(line[len(fence[1]) :] if line.startswith(fence[1]) else line)
    return blocks


def test_code_blocks_reads_fences_in_lists_and_their_languages():
    text = "Intro\n\n```bash\nmake test\n```\n\n1. Step\n\n   ```yaml\n   fleet: gpu\n   ```\n"
    assert code_blocks(text) == [("bash", ["make test"], False), ("yaml", ["fleet: gpu"], True)]


def test_no_code_block_is_wider_than_the_text_column():
    too_wide = [
        f"{path.relative_to(DOCS)}: {len(line)} characters: {line[:60]}..."
        for path in sorted(DOCS.rglob("*.md"))
        for _language, lines, in_list in code_blocks(path.read_text())
        for line in lines
        if len(line.rstrip()) > CODE_COLUMNS - (LIST_INDENT_COLUMNS if in_list else 0)
    ]
    assert too_wide == [], "\n".join(too_wide)


def test_troubleshooting_quotes_trainctls_own_messages():
    # Each message as the page quotes it, "..." for the part that names the user's value: every other piece
    # must be in trainctl's source, so a reworded message fails here until the page follows.
    from trainctl.aws import NO_REGION
    from trainctl.inspecting.ecs_exec import INSTALL_PLUGIN

    section = page("troubleshooting.md").split("## trainctl's messages")[1].split("\n## ")[0]
    messages = re.findall(r"^\| (`+) ?(.+?) ?\1 \|", section, re.M)
    assert len(messages) >= 15
    # The budget's refusal is worded where trainctl and the budget functions share it.
    sources = [*(ROOT / "trainctl").rglob("*.py"), ROOT / "budget_ledger" / "ledger.py"]
    source = "\n".join(path.read_text() for path in sources)
    for _, message in messages:
        pieces = [piece for piece in message.split("...") if len(piece.strip()) > 4]
        assert pieces and all(piece in source for piece in pieces), message
    quoted = [message for _, message in messages]
    assert NO_REGION in quoted and INSTALL_PLUGIN.split(":")[0] in quoted


def test_list_items_continue_with_four_spaces():
    # Python-Markdown takes a paragraph or a fence after a blank line into a list item only when it is indented
    # four spaces: at three, the item ends there, its code falls out and the next step is numbered 1. again.
    stray = [
        f"{path.relative_to(DOCS)}:{number + 2}"
        for path in sorted(DOCS.rglob("*.md"))
        for number, (before, line) in enumerate(itertools.pairwise(path.read_text().splitlines()))
        if not before.strip() and re.match(r" {1,3}\S", line) and not re.match(r" {1,3}([-*]|\d+\.) ", line)
    ]
    assert stray == []
