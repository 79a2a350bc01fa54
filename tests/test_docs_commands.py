"""Every shell example in README.md and docs/ works when pasted into bash, and every context value it
passes is one the app accepts.

What runs: each ```bash / ```sh / ```shell block whole, the `$ ` lines of each ```console or ```text block
(with the lines a trailing backslash continues), and each inline `code` span that is a command (`make ...`,
`cdk ...`, `npx cdk ...`, `trainctl ...`, `ARGS="..."` as `make deploy ARGS="..."`, and a lone
`-c key=value` as `cdk synth -c key=value`; the literal `-c key=value`, which names the syntax, is prose).
Each runs under `bash -e` in its own temporary folder, PATH starting with stubs for every command that
would reach AWS, the network or a build (tests/shell_examples.py: STUBBED); a stub records its arguments
and exits 0, so a block fails only on what bash itself refuses (a syntax error, an unquoted `(`, a
redirection from a file that is not there). A block runs whole, so it defines its own variables.

What is checked: every `-c key=value` that reaches `cdk` or `npx cdk`, and every one in a make ARGS as the
Makefile's recipe hands it to its shell (`$(CDK) deploy ... $(ARGS)`: bash reads the text again, so brace
expansion and quote removal happen there), is read by the app's own reader: config.image_build_check's
context_from (the CDK CLI's -c), then config.context.read_settings. A brace-expanded or split JSON value,
or an unquoted rate(...), fails with the page, the line and the app's refusal.

Placeholders: a `<words>` placeholder (`<id>`, `<the URI printed above>`), which a reader replaces, becomes
the word PLACEHOLDER before the block runs (bash would take the `<` for a redirection). A command whose
context has a placeholder, or `...`, in a value is not read whole (the real value is the reader's): its key
names are checked, and every other value is parsed on its own by its key's parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from config.context import check_keys, read_settings
from config.context_keys import ConfigError, Context
from config.image_build_check import context_from
from config.key_refusals import from_pydantic
from tests.shell_examples import (
    PAGES,
    PLACEHOLDER,
    Example,
    Run,
    context_arguments,
    examples,
    examples_in,
    make_stubs,
    run_all,
)

EXAMPLES = [example for page in PAGES for example in examples(page)]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_stubs(tmp_path_factory.mktemp("stubs"))


def refusal(context: dict[str, str]) -> str | None:
    """The app's refusal of a command's context values, or None when it takes them."""
    unknown = [key for key, value in context.items() if PLACEHOLDER in value or "..." in value]
    try:
        if not unknown:
            read_settings(context)
            return None
        check_keys(context)
        for key, value in context.items():
            if key not in unknown:
                try:
                    Context.model_validate({key: value})
                except ValidationError as error:
                    raise from_pydantic(error, {key: value}) from None
    except ConfigError as error:
        return str(error)
    return None


def problems(example: Example, done: Run, empty: Path) -> list[str]:
    """What is wrong with an example's run: bash's refusal, or the app's refusal of a command's context
    (`empty`: a folder without cdk.json, so that only the example's own -c values are read)."""
    if done.returncode:
        said = " / ".join(done.stderr.strip().splitlines()[-2:]) or "nothing on stderr"
        return [f"{example.where}: bash exits {done.returncode}: {said}\n{example.script}"]
    found = []
    for call in done.calls:
        arguments = context_arguments(call)
        if arguments is None or not any(a in ("-c", "--context") or a.startswith("-c=") for a in arguments):
            continue
        why = refusal(context_from(arguments, root=empty))
        if why:
            found.append(f"{example.where}: {' '.join(call)}\n  refused: {why}")
    return found


def checked(examples: list[Example], stubs: Path, tmp_path: Path) -> list[str]:
    runs = run_all([example.script for example in examples], stubs, tmp_path / "work")
    (tmp_path / "empty").mkdir()
    return [
        problem
        for example, done in zip(examples, runs, strict=True)
        for problem in problems(example, done, tmp_path / "empty")
    ]


def test_every_page_with_commands_is_read():
    pages = {example.page for example in EXAMPLES}
    assert {"README.md", "docs/budgets.md", "docs/deploy.md", "docs/health.md", "docs/jobs.md"} <= pages


PAGE = """Intro `make synth ARGS="-c gpuNodes=4"` and `trainctl jobs`, not `-c key=value` or `ls`.

```bash
make deploy
```

1. A step:

    ```sh
    trainctl check gpu
    ```

```console
$ trainctl submit gpu \\
    --nodes 4
job 1234 submitted
$ trainctl why 1234
```

```text
plain output
```

```yaml
workdir: .
```
"""


def test_blocks_prompts_and_inline_commands_are_read_and_output_is_not():
    found = [(example.line, example.script) for example in examples_in("docs/page.md", PAGE)]
    assert found == [
        (1, 'make synth ARGS="-c gpuNodes=4"'),
        (1, "trainctl jobs"),
        (3, "make deploy"),
        (9, "trainctl check gpu"),  # indented under a list item
        (13, "trainctl submit gpu \\\n    --nodes 4\ntrainctl why 1234"),  # no output line
    ]


@pytest.mark.parametrize("page", sorted({example.page for example in EXAMPLES}))
def test_the_pages_examples_run_and_the_app_takes_their_context(page, stubs, tmp_path):
    found = checked([example for example in EXAMPLES if example.page == page], stubs, tmp_path)
    assert found == [], "\n".join(found)


BROKEN = [
    # docs/budgets.md before this test: bash brace-expands the JSON into two words.
    (
        """make deploy ARGS='-c shares=llama:2,vision:1 -c budgets={"llama":20000,"vision":5000}'""",
        ["budgets='llama:20000'", "malformed JSON", """-c 'budgets={"llama":20000}'"""],
    ),
    # The JSON unquoted for cdk itself: the quotes go and the space splits it.
    ("""npx cdk synth -c fleets={"rl": {"instanceType": "g6e.48xlarge"}}""", ["fleets='{rl:'", "malformed JSON"]),
    # docs/health.md's rate(1 day) pasted into ARGS unquoted: make's shell refuses the parenthesis.
    ("""make deploy ARGS="-c healthCheckSchedule=rate(1 day)\"""", ["bash exits 2", "syntax error"]),
    # Escaped parentheses pass bash, and the space still splits the value.
    ("npx cdk synth -c healthCheckSchedule=rate\\(1 day\\)", ["'rate(1'", "cut short at a space"]),
    ("make diff ARGS='-c gpuNodes=four'", ["gpuNodes='four'", "not an integer"]),
    ("trainctl logs JOB > (", ["bash exits 2"]),
]


@pytest.mark.parametrize(("script", "expected"), BROKEN, ids=[str(i) for i in range(len(BROKEN))])
def test_a_broken_example_is_caught_with_its_place_and_value(script, expected, stubs, tmp_path):
    found = checked([Example("docs/page.md", 7, script)], stubs, tmp_path)
    assert len(found) == 1 and found[0].startswith("docs/page.md:7: "), found
    for fragment in expected:
        assert fragment in found[0], found[0]


def test_the_fixed_budgets_command_passes_and_a_placeholder_is_the_readers(stubs, tmp_path):
    fixed = """BUDGETS='{"llama":20000,"vision":5000}'
make deploy ARGS="-c shares=llama:2,vision:1 -c budgets='$BUDGETS'\""""
    assert checked([Example("docs/page.md", 1, fixed)], stubs, tmp_path / "a") == []
    # <id> is the reader's: slurm=pcs still parses, the missing AMI is not held against the page.
    placeholder = 'make deploy ARGS="-c slurm=pcs -c pcsAmiId=<id> -c pcsMaxNodes=16"'
    assert checked([Example("docs/page.md", 1, placeholder)], stubs, tmp_path / "b") == []
    # ... while the value beside it is still parsed.
    beside = 'make deploy ARGS="-c slurm=pcs -c pcsAmiId=<id> -c pcsMaxNodes=lots"'
    assert "pcsMaxNodes='lots'" in checked([Example("docs/page.md", 1, beside)], stubs, tmp_path / "c")[0]
