"""Files written onto a training node by its user data, packed small.

EC2 takes at most 16 KB of user data, counted before the base64 that the API and CloudFormation
wrap it in (EC2 user guide, "Run commands when you launch an EC2 instance with user data"), and
Batch adds a part of its own. So the node's scripts travel gzipped (mtime 0, so the template only
changes when a script does) and base64-encoded, inside a plain-text MIME part.
"""

from __future__ import annotations

import base64
import gzip


def pack(content: bytes) -> str:
    return base64.b64encode(gzip.compress(content, mtime=0)).decode()


def write_packed(path: str, content: bytes) -> str:
    """One shell command that writes `content` to `path` on the node."""
    return f"echo '{pack(content)}' | base64 -d | gunzip > {path}"
