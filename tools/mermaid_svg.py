"""Renders a Mermaid source to SVG with mermaid-cli in a headless Chromium (for the home page's diagram).

Only `make docs-gen` calls this, and only when the diagram's source changed: the committed SVG carries the hash
of the source it was drawn from, so the tests and a site build need neither Node's mermaid-cli nor a browser.
mermaid-cli runs through npx at the exact version below (fetched once into npm's cache); its bundled browser
download is skipped and the machine's Chromium is used instead (`apt-get install chromium`, or CHROME=path).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The renderer, pinned: a new version may draw differently, so it is part of the SVG's stamp and changing it
# redraws the picture on the next `make docs-gen`.
MERMAID_CLI = "@mermaid-js/mermaid-cli@12.2.0"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class RenderError(RuntimeError):
    """The SVG could not be drawn; the message is one line that says what to do."""


def browser() -> str | None:
    """The Chromium to draw with: $CHROME when set, else the first of BROWSERS on the PATH."""
    return os.environ.get("CHROME") or next((found for name in BROWSERS if (found := shutil.which(name))), None)


def render(source: str) -> str:
    """The SVG mermaid-cli draws of `source` (Mermaid text), on a white background."""
    chrome = browser()
    if chrome is None:
        raise RenderError(
            "the architecture diagram changed and no Chromium was found to draw it: install one "
            "(apt-get install chromium) or set CHROME to its path, then run `make docs-gen` again"
        )
    # The venv's Node first (`make bootstrap` installs the version package.json asks for), as under make.
    npx = shutil.which("npx", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if npx is None:
        raise RenderError("the architecture diagram changed and npx (Node.js) is not on the PATH to draw it")
    with tempfile.TemporaryDirectory(prefix="mermaid-svg-") as folder:
        work = Path(folder)
        (work / "diagram.mmd").write_text(source)
        # Chromium's sandbox refuses to start as root (a container); the page drawn is our own text.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        (work / "puppeteer.json").write_text(json.dumps({"executablePath": chrome, "args": args}))
        command = [npx, "--yes", f"--package={MERMAID_CLI}", "--", "mmdc", "--quiet"]
        command += ["-i", "diagram.mmd", "-o", "diagram.svg", "-p", "puppeteer.json", "-b", "white"]
        env = {**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"}
        # npx and its arguments are ours; the only input is the diagram's file.
        result = subprocess.run(command, cwd=work, capture_output=True, text=True, env=env, timeout=600)  # noqa: S603
        if result.returncode != 0 or not (work / "diagram.svg").exists():
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise RenderError(f"{MERMAID_CLI} could not draw the diagram (exit {result.returncode}): {lines[-1]}")
        return (work / "diagram.svg").read_text()
