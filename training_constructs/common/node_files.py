"""Files written onto a training node by its user data, packed small.

EC2 takes at most 16 KB of user data, counted before the base64 that the API and CloudFormation
wrap it in (EC2 user guide, "Run commands when you launch an EC2 instance with user data"), and
Batch adds a part of its own. So the node's scripts travel gzipped (mtime 0, so the template only
changes when a script does) and base64-encoded, inside a plain-text MIME part.
"""

from __future__ import annotations

import ast
import base64
import functools
import gzip
import io
import tokenize


# Every fleet packs the same scripts: the work is done once per process (it is most of an
# all-types build otherwise). Bounded: per-fleet content (the agent's configuration) passes through too.
@functools.lru_cache(maxsize=64)
def pack(content: bytes) -> str:
    return base64.b64encode(gzip.compress(content, mtime=0)).decode()


def write_packed(path: str, content: bytes) -> str:
    """One shell command that writes `content` to `path` on the node."""
    return f"echo '{pack(content)}' | base64 -d | gunzip > {path}"


@functools.cache
def compact_python(source: str) -> str:
    """`source` without what the interpreter never reads: docstrings (the module's cut to its first line,
    which argparse reads), comments, and blank lines outside multi-line strings. Code stays as written."""
    tree = ast.parse(source)
    lines = source.splitlines()
    docstrings = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                text = first.value.value
                if isinstance(text, str) and first.end_lineno is not None:
                    # Only the module's first line is read (argparse); a body needs one statement.
                    keep = isinstance(node, ast.Module) or len(node.body) == 1
                    head = text.strip().splitlines()[0] if keep and text.strip() else None
                    docstrings.append((first.lineno, first.end_lineno, first.col_offset, head))
    for start, end, column, head in sorted(docstrings, reverse=True):
        lines[start - 1 : end] = [] if head is None else [" " * column + repr(head)]
    text = "\n".join(lines) + "\n"
    lines = text.splitlines()
    inside_strings: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            inside_strings.update(range(token.start[0] + 1, token.end[0] + 1))
        elif token.type == tokenize.COMMENT and token.start[0] > 1:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column].rstrip()
    kept = [line for number, line in enumerate(lines, start=1) if number in inside_strings or number == 1 or line]
    return "\n".join(kept) + "\n"
