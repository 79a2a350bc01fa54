"""Keeps every refusal of a context value to one line of about 200 characters: the value as the user
wrote it (cut short when long), the closest allowed names rather than all of them, and where the full
list is. docs/reference/context-keys.md keeps the complete "allowed" text of each key."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

MAX_LINE = 200
# Where every key's full "allowed" text is, for a refusal that has no room for it.
KEY_TABLE = "docs/reference/context-keys.md"
MAX_VALUE = 48

# Short "allowed" texts for keys and fleet fields whose full text is a long list or a long sentence.
CATALOG_TYPES = "an EFA-capable type of docs/reference/catalog.md"
SHORT_ALLOWED = {
    "fleets": "a JSON object of named fleets (docs/fleets.md)",
    "budgets": 'empty, or a JSON object of team: monthly US dollars ({"llama": 20000})',
    "healthCheckSchedule": "empty, rate(1 hour) to rate(6 days), or cron(M H * * ? *) with M one minute",
    "shares": "empty, or identifier:share,... (identifier: letters and digits, * suffix; share 1..1000)",
    "interfaceEndpoints": "any of: ",  # completed with the names in config/context.py
}


# Where docs/deploy.md shows how to pass JSON, rate(...) and cron(...) through the shell and make's ARGS.
QUOTING_DOCS = "docs/deploy.md, quoting"
# The JSON keys' examples for that hint: one short, valid value each.
JSON_EXAMPLES = {
    "fleets": '{"rl":{"instanceType":"g6e.48xlarge"}}',
    "budgets": '{"llama":20000}',
    "budgetPrices": '{"llm":31.5}',
}


def quote_json(key: str) -> str:
    """What a refusal of malformed JSON allows: the value as JSON, the whole -c argument in single quotes
    (unquoted, bash removes the double quotes, splits at spaces and brace-expands {a,b} into two words)."""
    example = JSON_EXAMPLES.get(key, "{...}")
    return f"JSON, the whole argument in quotes: -c '{key}={example}' ({QUOTING_DOCS})"


def quote_schedule(key: str, value: str) -> str:
    """What a refusal of a schedule cut at a space allows: the whole -c argument in quotes (unquoted, bash
    refuses the parentheses, and escaped ones still split the value at its spaces)."""
    example = "cron(0 3 * * ? *)" if value.startswith("cron") else "rate(1 day)"
    return f"the whole argument in quotes: -c '{key}={example}' ({QUOTING_DOCS})"


def shown(value: Any) -> str:
    """repr(value), cut to MAX_VALUE characters."""
    text = repr(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 4] + "...'"


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)


def did_you_mean(name: str, choices: Iterable[str], where: str) -> str:
    """'did you mean a, b? (where)', or just 'where' when nothing is close."""
    near = closest(name, choices)
    return f"did you mean {', '.join(near)}? ({where})" if near else f"see {where}"
