"""Files written onto a training node by its user data, packed small.

EC2 takes at most 16 KB of user data, counted before the base64 that the API and CloudFormation
wrap it in (EC2 user guide, "Run commands when you launch an EC2 instance with user data"), and
Batch adds a part of its own. So the node's files travel together as one bundle: a one-line JSON
header of (path, size) pairs, then the files' bytes one after the other, gzipped as one stream (the
scripts share much of their vocabulary, so one stream is about a kilobyte smaller than one per file;
mtime 0, so the template only changes when a file does) and base64-encoded, inside a plain-text MIME
part. The node splits it with python3's standard library (Python 3.9 on the ECS-optimized AL2023
AMIs, which the boot check runs on too); no `tar`.
"""

from __future__ import annotations

import ast
import base64
import functools
import gzip
import io
import json
import tokenize
from collections.abc import Sequence

# (absolute path on the node, content)
NodeFile = tuple[str, bytes]

# Decodes the whole bundle before writing anything (gzip checks its CRC), so a damaged bundle writes no
# file at all; each file is written beside its path and renamed over it, so none is ever seen half
# written. Mode as a shell redirect gives it (0666 less the umask). An optional second argument is a
# root folder prefixed to every path (tests run the command into a temporary one).
SPLITTER = """import base64,gzip,json,os,sys
r=(sys.argv+[""])[2]
h,d=gzip.decompress(base64.b64decode(sys.argv[1])).split(b"\\n",1)
for p,n in json.loads(h):
 p=r+p;os.makedirs(os.path.dirname(p),exist_ok=True)
 with open(p+"~","wb") as f:f.write(d[:n])
 os.replace(p+"~",p);d=d[n:]"""


# Every fleet packs the same scripts: the work is done once per process (it is most of an
# all-types build otherwise). Bounded: per-fleet content (the agent's configuration) passes through too.
@functools.lru_cache(maxsize=64)
def pack(content: bytes) -> str:
    return base64.b64encode(gzip.compress(content, mtime=0)).decode()


def bundle(files: Sequence[NodeFile]) -> bytes:
    """The files as one byte string: the JSON header line, then each file's bytes in order."""
    paths = [path for path, _ in files]
    for path in paths:
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"node file {path!r}: expected an absolute path to a file")
    duplicates = sorted({path for path in paths if paths.count(path) > 1})
    if duplicates:
        raise ValueError(f"node files written twice: {', '.join(duplicates)}")
    header = json.dumps([[path, len(content)] for path, content in files], separators=(",", ":"))
    return header.encode() + b"\n" + b"".join(content for _, content in files)


def write_packed_files(files: Sequence[NodeFile]) -> str:
    """One shell command that writes every file (creating its folders) on the node, from one gzip stream."""
    if not files:
        raise ValueError("no node files to write")
    return f"python3 -c '{SPLITTER}' '{pack(bundle(files))}'"


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
