"""A context value the shell took apart (JSON without its quotes, a schedule cut at a space) is refused in
one line that says how to quote it; JSON that kept its quotes is a typo, refused with the parser's detail."""

from __future__ import annotations

import pytest

from config.context import read_settings
from config.context_keys import ConfigError, Context
from config.refusals import JSON_EXAMPLES, MAX_LINE


def refusal(**context: str) -> str:
    with pytest.raises(ConfigError) as caught:
        read_settings(context)
    return str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("budgets", "llama:20000"),  # -c budgets={"llama":20000,"vision":5000}: brace expansion's first word
        ("budgets", "{llama:20000}"),  # -c budgets={"llama":20000}: the quotes removed
        ("fleets", "{rl:"),  # -c fleets={"rl": {...}}: split at the space
        ("budgetPrices", "{llm:31.5}"),
        ("budgetPrices", "x" * 300),  # the hint stays when the value is long
    ],
)
def test_json_the_shell_took_apart_is_refused_with_how_to_quote_it(key, value):
    message = refusal(**{key: value})
    assert message.startswith(f"context key {key}=") and "malformed JSON" in message, message
    assert f"the whole argument in quotes: -c '{key}={JSON_EXAMPLES[key]}'" in message, message
    assert "docs/deploy.md, quoting" in message
    assert "\n" not in message and len(message) <= MAX_LINE, message


def test_json_with_its_quotes_keeps_the_parsers_detail_and_no_shell_hint():
    message = refusal(budgets='{"llama": 20000,}')
    assert "malformed JSON (Expecting property name enclosed in double quotes at column 17)" in message
    assert "-c '" not in message


def test_every_quoting_example_is_json_the_app_takes():
    # The hint's own example must parse: each key's parser, as the app reads a -c value.
    assert set(JSON_EXAMPLES) == {"fleets", "budgets", "budgetPrices"}
    for key, example in JSON_EXAMPLES.items():
        assert Context.model_validate({key: example}).model_dump(by_alias=True)[key], key


@pytest.mark.parametrize(
    ("value", "example"),
    [("rate(1", "rate(1 day)"), ("cron(0", "cron(0 3 * * ? *)"), ("cron(0 3 * *", "cron(0 3 * * ? *)")],
)
def test_a_schedule_cut_at_a_space_says_how_to_quote_it(value, example):
    message = refusal(healthCheckSchedule=value)
    assert f"healthCheckSchedule={value!r}: cut short at a space by the shell" in message, message
    assert f"-c 'healthCheckSchedule={example}'" in message and len(message) <= MAX_LINE, message
    read_settings({"healthCheckSchedule": example})  # and the example is one the app takes


def test_a_whole_schedule_that_is_wrong_gets_the_usual_refusal():
    message = refusal(healthCheckSchedule="rate(2 weeks)")
    assert "not a rate(...) or six-field cron(...)" in message and "cut short" not in message
