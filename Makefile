# Two commands from a fresh clone: `make synth` and `make test`. Each bootstraps what it needs:
# .venv with pinned Python packages, Node.js >= 22 (the machine's own, or one from PyPI into
# .venv), and the pinned CDK CLI from package-lock.json.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
CDK := $(CURDIR)/node_modules/.bin/cdk
ARGS ?=
# make faults ENTRIES="kill-child hang": the fault catalog's entries to run (default: all).
ENTRIES ?=
# cdk deploy's --require-approval: never (pipelines, no terminal), broadening (the CLI's default) or any-change.
APPROVAL ?=

# .venv/bin first: its python, and its node when the machine's is too old.
export PATH := $(BIN):$(PATH)
# No telemetry or notices from the CLI: these machines reach only package registries.
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: bootstrap synth typecheck test faults deploy diff destroy bench bench-checkpoints bench-trainctl lint format docs docs-gen docs-example clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: requirements.txt requirements-node.txt | $(VENV)/bin/python
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	@if node -e 'process.exit(parseInt(process.versions.node) >= 22 ? 0 : 1)' 2>/dev/null; then \
		echo "node $$(node --version) is recent enough"; \
	else \
		echo "node missing or older than 22: installing Node.js from PyPI into $(VENV)"; \
		$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-node.txt; \
	fi
	@touch $@

$(VENV)/.dev: requirements-dev.txt requirements-test.txt requirements-docs.txt $(VENV)/.runtime
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt -r requirements-test.txt \
		-r requirements-docs.txt
	@touch $@

# trainctl, editable: the console script runs this checkout's trainctl/ and config/; with what
# `trainctl rehearse` runs (torch's CPU wheel, moto's server).
$(VENV)/.trainctl: requirements-cli.txt requirements-rehearsal.txt pyproject.toml $(VENV)/.runtime
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-cli.txt -r requirements-rehearsal.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

node_modules/.installed: package.json package-lock.json $(VENV)/.runtime
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

bootstrap: $(VENV)/.runtime $(VENV)/.trainctl node_modules/.installed

synth: bootstrap
	$(CDK) synth --quiet $(ARGS)

# mypy --strict ([tool.mypy] in pyproject.toml: trainctl, the launcher, tools and the typed config
# modules) as its own step, before the suite: untimed, so a cold run on a loaded machine cannot fail it.
typecheck: $(VENV)/.dev
	$(BIN)/python -m mypy

test: bootstrap $(VENV)/.dev typecheck
	$(BIN)/pytest $(ARGS)

# The fault catalog (trainctl/rehearsal/catalog.py): every entry rehearsed on this machine with the real
# launcher, one line each; exits 1 when an entry does not end as users need. ENTRIES names some.
faults: synth
	$(BIN)/python -m trainctl.rehearsal.catalog $(ENTRIES)

deploy: bootstrap
	$(BIN)/python -m config.image_build_check $(ARGS)
	$(CDK) deploy --all -c templateValidation=true $(if $(APPROVAL),--require-approval $(APPROVAL)) $(ARGS)

diff: bootstrap
	$(CDK) diff $(ARGS)

destroy: bootstrap
	$(CDK) destroy --all $(ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: bootstrap $(VENV)/.dev
	$(BIN)/python bench/bench.py $(ARGS)
	$(BIN)/python bench/trainctl_bench.py
	$(BIN)/python bench/step_timing_bench.py

# The checkpoint copier against a local S3 server: an idle poll over 1,000 files, a 1 GiB upload.
bench-checkpoints: $(VENV)/.dev
	$(BIN)/python bench/checkpoint_bench.py $(ARGS)

# `trainctl jobs` over 1,000 jobs on moto's AWS APIs on 127.0.0.1.
bench-trainctl: $(VENV)/.dev
	$(BIN)/python bench/trainctl_bench.py $(ARGS)

# The reference pages in docs/reference/ from the code that defines them (tests/test_docs.py fails when one is stale),
# the home page's architecture diagram from a synth: its Mermaid source, and the SVG the site shows, redrawn only
# when the source changed, with mermaid-cli (npx, pinned in tools/mermaid_svg.py) in the machine's Chromium
# (apt-get install chromium, or CHROME=path; no browser is needed when the diagram is unchanged), and
# docs/rehearsal.md's worked example from its recorded run (tools/rehearsal_example.py).
docs-gen: $(VENV)/.dev $(VENV)/.trainctl
	$(BIN)/python -m tools.docs_reference
	$(BIN)/python -m tools.rehearsal_example

# Record the worked example's rehearsal again (about 30 s), then render it: after a change of what it does.
docs-example: synth $(VENV)/.dev $(VENV)/.trainctl
	$(BIN)/python -m tools.rehearsal_example --record

# The site, strictly (a broken link or a page outside the nav fails it), into site/ (not committed). It reads
# offline: no web font, no CDN script (tests/test_docs_offline.py).
docs: docs-gen
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache .ruff_cache site
