"""How a refused context value is told: one line that names the key (or `fleets.<name>.<field>`), the
value as given and what is allowed, short enough to read (config/refusals.py holds the limits).
config/context.py raises these for its own rules and for pydantic's errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from config import limits, refusals
from config.context_keys import KEYS, ConfigError, FleetModel
from config.placements import FIELDS_TEXT

# Each fleet field's alias and its allowed text (context_keys.key() puts it in json_schema_extra).
_FLEET_FIELDS: dict[str, str] = {
    str(f.alias): str(f.json_schema_extra["allowed"])
    for f in FleetModel.model_fields.values()
    if isinstance(f.json_schema_extra, dict)
}
_SHORT_ALLOWED = refusals.SHORT_ALLOWED | {
    "interfaceEndpoints": refusals.SHORT_ALLOWED["interfaceEndpoints"] + ", ".join(limits.INTERFACE_ENDPOINTS),
    "instanceType": refusals.CATALOG_TYPES,
}
_PROBLEMS = {
    "greater_than_equal": "below {ge}",
    "less_than_equal": "above {le}",
    "string_pattern_mismatch": "malformed",
    "string_too_long": "longer than {max_length} characters",
    "literal_error": "not a known option",
    "extra_forbidden": "unknown field",
    "missing": "required",
    "string_type": "not a string",
    "dict_type": "not a JSON object",
    "model_type": "not a JSON object",
}


def fail(path: str, value: Any, problem: str, allowed: str | None = None) -> ConfigError:
    if allowed is None:
        allowed = _allowed(path)
    line = f"context key {path}={refusals.shown(value)}: {problem}; allowed: {allowed}"
    if len(line) > refusals.MAX_LINE:
        # A long value beside a long list: point at the list instead of printing it.
        line = f"context key {path}={refusals.shown(value)}: {problem}; allowed: see {refusals.KEY_TABLE}"
    return ConfigError(line)


def _allowed(path: str) -> str:
    """What a refusal says is allowed: the key's own text, or a short one where that is a long list."""
    parts = path.split(".")
    # A top-level key, a fleet (fleets.<name>) or one of its fields (fleets.<name>.<field>).
    name = parts[0] if len(parts) < 3 else parts[2]
    if name in _SHORT_ALLOWED:
        return _SHORT_ALLOWED[name]
    return KEYS[name].allowed if len(parts) < 3 else _FLEET_FIELDS.get(name, ", ".join(_FLEET_FIELDS))


def from_pydantic(error: ValidationError, given: Mapping[str, Any]) -> ConfigError:
    first = error.errors()[0]
    path = ".".join(str(part) for part in first["loc"])
    if len(first["loc"]) == 1 and path in given:
        first["input"] = given[path]  # what the user wrote, before CLI strings were parsed
    problem = str(first["ctx"]["error"]) if first["type"] == "value_error" else _PROBLEMS.get(first["type"])
    if first["type"] == "extra_forbidden":
        fields = FIELDS_TEXT if "fallback" in path.split(".") else ", ".join(_FLEET_FIELDS)
        return fail(path, first["input"], "unknown field", "fields " + fields)
    if first["type"] == "missing":
        return ConfigError(f"context key {path}: required; allowed: {_allowed(path)}")
    if problem and problem.startswith("malformed JSON") and _shell_took_quotes(path, first["input"]):
        return _malformed_json(path, first["input"], problem)
    return fail(path, first["input"], (problem or first["msg"]).format(**first.get("ctx", {})))


def _shell_took_quotes(path: str, value: Any) -> bool:
    """A JSON key's string without a double quote: what bash leaves of unquoted JSON (it removes the quotes,
    splits at spaces and brace-expands {"a":1,"b":2} into two words). JSON with its quotes is a typo instead,
    and its refusal keeps the parser's detail."""
    return path in refusals.JSON_EXAMPLES and isinstance(value, str) and '"' not in value


def _malformed_json(path: str, value: Any, problem: str) -> ConfigError:
    """The refusal says how to quote the value, and drops the parser's detail where the line would run past
    its limit."""
    allowed = refusals.quote_json(path)
    refusal = fail(path, value, problem, allowed)
    return refusal if allowed in str(refusal) else fail(path, value, "malformed JSON", allowed)
