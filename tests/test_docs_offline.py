"""The documentation site reads offline and its wide pages fit the column (issue 57): the home page's diagram is
a committed SVG stamped with the source it was drawn from, no page loads a script or stylesheet from another host,
pages of wide tables leave out the table of contents, and the CLI reference puts `rehearse` beside `run`."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer.main

from tests.docs_text import DOCS, build_site, mkdocs_config, page
from tools import architecture, docs_reference, mermaid_svg
from trainctl.cli import app

HIDE_TOC = "---\nhide:\n  - toc\n---\n"


class _Loads(HTMLParser):
    """What a page makes the browser fetch: script sources, linked stylesheets, fonts and icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        name = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src"}.get(tag)
        if name and values.get(name):
            self.urls.append(str(values[name]))


def loads(html: str) -> list[str]:
    parser = _Loads()
    parser.feed(html)
    return parser.urls


def elsewhere(url: str) -> bool:
    """Whether fetching `url` from a page served at 127.0.0.1 leaves the machine."""
    parts = urlsplit(url)
    return bool(parts.netloc) and parts.hostname not in ("127.0.0.1", "localhost")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


def test_the_parser_finds_what_a_page_fetches_and_where():
    html = (
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//unpkg.com/mermaid.min.js"></script><script src="../assets/bundle.js"></script>'
        '<img src="assets/architecture.svg"><a href="https://aws.amazon.com/">a link is not fetched</a>'
    )
    found = loads(html)
    assert found == [
        "https://fonts.googleapis.com/css?family=Roboto",
        "//unpkg.com/mermaid.min.js",
        "../assets/bundle.js",
        "assets/architecture.svg",
    ]
    assert [url for url in found if elsewhere(url)] == found[:2]
    assert not elsewhere("http://127.0.0.1:8000/assets/x.css")


def test_no_page_fetches_from_another_host(site: Path):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    fetched = {path.relative_to(site).as_posix(): loads(path.read_text()) for path in pages}
    outside = {name: [url for url in urls if elsewhere(url)] for name, urls in fetched.items()}
    assert {name: urls for name, urls in outside.items() if urls} == {}
    # The theme fetches Mermaid from a CDN for any element of class "mermaid"; none is left for it to draw.
    assert [path.relative_to(site).as_posix() for path in pages if 'class="mermaid"' in path.read_text()] == []
    # The home page shows the committed SVG, which the build copies.
    home = fetched["index.html"]
    assert "assets/architecture.svg" in home and (site / "assets" / "architecture.svg").exists()


def test_the_theme_is_told_not_to_fetch_fonts_or_mermaid():
    config = mkdocs_config()
    assert config["theme"]["font"] is False  # the default fetches Roboto from Google Fonts
    assert "pymdownx.superfences" in config["markdown_extensions"]  # plain: no Mermaid custom fence
    for item in config.get("extra_javascript", []) + config.get("extra_css", []):
        assert not urlsplit(str(item)).netloc, item


def test_the_committed_svg_is_a_self_contained_drawing_of_every_stack():
    first, svg = architecture.PICTURE.read_text().split("\n", 1)
    stamp = r"<!-- drawn from docs/assets/architecture\.mmd sha256:[0-9a-f]{64} by \S+ \(make docs-gen\) -->"
    assert re.fullmatch(stamp, first)
    assert svg.lstrip().startswith("<svg")
    for stack in re.findall(r"^  subgraph (\w+)$", architecture.SOURCE.read_text(), re.M):
        assert f">{stack}<" in svg, stack
    # Nothing it would fetch: shown as an image, it could not anyway, and opened on its own it must not.
    assert not re.search(r"""(?:href|src)=["']https?:|url\(\s*["']?https?:|@import""", svg)


def test_the_stamp_names_the_source_and_the_renderer(tmp_path, monkeypatch):
    picture = tmp_path / "architecture.svg"
    monkeypatch.setattr(architecture, "PICTURE", picture)
    source = "flowchart LR\n  A --> B\n"
    assert not architecture.drawn_from(source)  # no picture yet
    picture.write_text(architecture.stamp(source, mermaid_svg.MERMAID_CLI) + "\n<svg></svg>\n")
    assert architecture.drawn_from(source)
    assert not architecture.drawn_from(source.replace("B", "C"))
    picture.write_text(architecture.stamp(source, "@mermaid-js/mermaid-cli@1.0.0") + "\n<svg></svg>\n")
    assert not architecture.drawn_from(source)  # another renderer's drawing is redrawn


def test_docs_gen_redraws_the_svg_only_when_its_source_changed(tmp_path, monkeypatch):
    index = tmp_path / "index.md"
    index.write_text(f"# Home\n\n{architecture.BEGIN}\nold\n{architecture.END}\n")
    monkeypatch.setattr(architecture, "INDEX", index)
    monkeypatch.setattr(architecture, "SOURCE", tmp_path / "assets" / "architecture.mmd")
    monkeypatch.setattr(architecture, "PICTURE", tmp_path / "assets" / "architecture.svg")
    drawn: list[str] = []
    monkeypatch.setattr(mermaid_svg, "render", lambda source: drawn.append(source) or f"<svg>{len(drawn)}</svg>")
    block = f"{architecture.BEGIN}\n\nnew\n\n{architecture.END}"
    first, second = "flowchart LR\n  A --> B\n", "flowchart LR\n  A --> C\n"
    assert architecture.stale(first, block) == [
        "docs/index.md's architecture diagram",
        "docs/assets/architecture.mmd",
        "docs/assets/architecture.svg",
    ]
    architecture.write(first, block)
    assert drawn == [first] and architecture.stale(first, block) == []
    assert (tmp_path / "assets" / "architecture.svg").read_text().endswith("\n<svg>1</svg>\n")
    architecture.write(first, block)
    assert drawn == [first]  # unchanged: no browser needed
    assert architecture.stale(second, block) == ["docs/assets/architecture.mmd", "docs/assets/architecture.svg"]
    architecture.write(second, block)
    assert drawn == [first, second] and architecture.stale(second, block) == []


def test_a_changed_diagram_without_a_browser_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(mermaid_svg, "browser", lambda: None)
    with pytest.raises(mermaid_svg.RenderError) as error:
        mermaid_svg.render("flowchart LR\n  A --> B\n")
    message = str(error.value)
    assert "\n" not in message and "apt-get install chromium" in message and "CHROME" in message


def test_pages_of_wide_tables_leave_out_the_table_of_contents(site: Path):
    assert page("reference/fault-catalog.md").startswith(HIDE_TOC)
    for name in docs_reference.PAGES:
        text = page(f"reference/{name}")
        columns = max((line.count("|") - 1 for line in text.splitlines() if line.startswith("|---")), default=0)
        assert text.startswith(HIDE_TOC) == (columns >= 4), (name, columns)
    # The theme honours it: the fault catalog's contents sidebar is hidden, the CLI reference's is not.
    toc = re.compile(r'<div class="md-sidebar md-sidebar--secondary"[^>]*data-md-type="toc"[^>]*>')
    pages = {name: (site / "reference" / name / "index.html").read_text() for name in ("fault-catalog", "cli")}
    sidebars = {name: toc.findall(html) for name, html in pages.items()}
    assert {name: ["hidden" in tag for tag in tags] for name, tags in sidebars.items()} == {
        "fault-catalog": [True],
        "cli": [False],
    }


def test_page_order_moves_a_command_beside_the_one_it_goes_with():
    names = ["status", "submit", "run", "sweep", "check", "rehearse"]
    assert docs_reference.page_order(names) == ["status", "submit", "run", "rehearse", "sweep", "check"]
    assert docs_reference.page_order(["status", "rehearse", "check"]) == ["status", "rehearse", "check"]  # no run


def test_the_cli_reference_lists_rehearse_right_after_run():
    group = typer.main.get_command(app)
    listed = list(group.list_commands(group.context_class(group, info_name="trainctl")))
    headings = re.findall(r"^## `trainctl ([\w-]+)", page("reference/cli.md"), re.M)
    on_page = list(dict.fromkeys(headings))
    assert on_page.index("rehearse") == on_page.index("run") + 1
    assert [name for name in on_page if name != "rehearse"] == [name for name in listed if name != "rehearse"]


def test_the_home_title_keeps_its_command_whole():
    title = page("index.md").splitlines()[0]
    assert title.startswith("# ") and "`cdk deploy --all`" in title
    css = (DOCS / "stylesheets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset h1 code \{\s*white-space: nowrap;", css)
