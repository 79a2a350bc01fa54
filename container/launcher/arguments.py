"""The job's command with `${NAME}` taken from the node's environment (docs/jobs.md, "Paths in the command").

A Batch job's command reaches the container as an argument list, with no shell between (ECS passes it to the
entrypoint as given), so `--checkpoint_path ${CHECKPOINT_DIR}/snapshot.pt` would reach the script literally.
The launcher expands it, once the node knows its paths (CHECKPOINT_DIR, WORKDIR_DIR): `${NAME}` of a set
variable becomes its value; `$$` is one literal `$`; anything else stays as written: a bare `$NAME`, a `${...}`
that is no variable name (an OmegaConf or Hydra interpolation such as `${now:%H-%M}` or `${model.dim}`), and
a `${NAME}` the environment does not set, which is also said in one line (a Hydra `${seed}` stays Hydra's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

# `$$` first, so that `$${NAME}` is a literal `${NAME}`.
_TOKEN = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(
    args: Sequence[str], env: Mapping[str, str], *, note: Callable[[str], None] = lambda line: None
) -> list[str]:
    """`args` with each `${NAME}` of a variable `env` sets replaced by its value and each `$$` by `$`; an unset
    name is left as written and `note` is told once per name."""
    unset: list[str] = []

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        if name in env:
            return env[name]
        if name not in unset:
            unset.append(name)
        return match.group(0)

    expanded = [_TOKEN.sub(one, arg) for arg in args]
    for name in unset:
        note(f"${{{name}}} in the command: the job's environment does not set {name}, so it is passed as written")
    return expanded
