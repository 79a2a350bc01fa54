"""One naming style for every `--json` output: camelCase keys, as the AWS APIs trainctl sits on (jobId,
statusReason). Where a report is built with Python's names (the rehearsal's), its keys are turned at the
output."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def camel(name: str) -> str:
    """exit_code -> exitCode, detect_s -> detectSeconds (a seconds suffix spelled out); a name without an
    underscore is left as it is."""
    if name.endswith("_s"):
        name = name[:-2] + "_seconds"
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_keys(value: Any, *, keep: Collection[str] = ()) -> Any:
    """`value` with every dict key in camelCase, at any depth; the dicts under a key in `keep` are data
    (environment names, tags) and are left as they are."""
    if isinstance(value, dict):
        return {camel(str(k)): v if k in keep else camel_keys(v, keep=keep) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [camel_keys(v, keep=keep) for v in value]
    return value
