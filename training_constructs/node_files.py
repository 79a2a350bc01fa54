"""Files written onto a training node by its user data, packed small.

EC2 takes at most 16 KB of user data, counted before the base64 that the API and CloudFormation
wrap it in (EC2 user guide, "Run commands when you launch an EC2 instance with user data"), and
Batch adds a part of its own. So the node's scripts travel gzipped (mtime 0, so the template only
changes when a script does) and base64-encoded, inside a plain-text MIME part. Python scripts
travel without their docstrings, comment lines and blank lines (`strip_python`): the same program,
about a tenth smaller packed; the repository keeps the commented source.
"""

from __future__ import annotations

import ast
import base64
import gzip

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if isinstance(node, _DOCUMENTED) and isinstance(body, list) and len(body) > 1:
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None


def strip_python(source: bytes) -> bytes:
    """`source` with its module docstring cut to its first line (scripts print it as their --help),
    without other docstrings, whole-line comments (a shebang stays) and blank lines; every other line
    verbatim (tests/test_host_check.py compares the syntax trees)."""
    text = source.decode()
    lines = text.splitlines(keepends=True)
    replace: dict[int, str] = {}
    for node in ast.walk(ast.parse(text)):
        docstring = _docstring(node)
        if docstring is None:
            continue
        for number in range(docstring.lineno, (docstring.end_lineno or docstring.lineno) + 1):
            replace[number] = ""
        if isinstance(node, ast.Module):
            replace[docstring.lineno] = f'"""{str(docstring.value.value).splitlines()[0]}"""\n'  # type: ignore[attr-defined]
    kept = [
        replace.get(number, line)
        for number, line in enumerate(lines, start=1)
        if line.strip() and (number == 1 or not line.lstrip().startswith("#"))
    ]
    return "".join(kept).encode()


def pack(content: bytes) -> str:
    return base64.b64encode(gzip.compress(content, mtime=0)).decode()


def write_packed(path: str, content: bytes) -> str:
    """One shell command that writes `content` to `path` on the node."""
    return f"echo '{pack(content)}' | base64 -d | gunzip > {path}"
