# Two commands on a fresh machine that has python3, git and make:
#   make run    start `enroute dev` (all roles on loopback, file:// store)
#   make test   install what is needed, lint, type-check and run every test
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
export UV_PYTHON_PREFERENCE := only-system
PYTEST_ARGS ?= -n 2

.PHONY: nightly all sync lint typecheck imports proto proto-check test test-fast conformance run bench clean

all: test

$(UV):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet uv==$(UV_VERSION)

sync: $(UV)
	$(UV) sync --locked --all-packages

lint: sync
	$(UV) run --locked ruff check .
	$(UV) run --locked ruff format --check .

typecheck: sync
	$(UV) run --locked mypy

imports: sync
	$(UV) run --locked lint-imports

# RPC contract: regenerate the committed stubs, or fail when they are stale.
proto: sync
	$(UV) run --locked python libs/enroute-proto/scripts/generate.py

proto-check: sync
	$(UV) run --locked python libs/enroute-proto/scripts/check.py

test: lint typecheck imports proto-check
	$(UV) run --locked pytest -m "not nightly" $(PYTEST_ARGS)
	$(MAKE) conformance

# The black-box contract suite (../shared/conformance) against `enroute dev`.
CONFORMANCE := ../shared/conformance
conformance: sync
	@if [ -d $(CONFORMANCE) ]; then \
	  PYTHONDONTWRITEBYTECODE=1 $(UV) run --locked pytest $(CONFORMANCE) -q -p no:cacheprovider \
	    --enroute-cmd=".venv/bin/enroute dev" $(PYTEST_ARGS); \
	else echo "$(CONFORMANCE) not found: conformance skipped" >&2; fi

# The long seeded sweeps (at least 20 runs per cluster scenario).
nightly: sync
	$(UV) run --locked pytest -m nightly $(PYTEST_ARGS)

# Everything but the suites marked slow; CI runs them all through `make test`.
test-fast: sync
	$(UV) run --locked pytest -m "not slow and not nightly" $(PYTEST_ARGS)

run: sync
	.venv/bin/enroute dev

bench: sync
	$(UV) run --locked python -m bench.codecs
	$(UV) run --locked python -m bench.storage
	$(UV) run --locked python -m bench.ledger_store

clean:
	rm -rf .venv $(TOOLS) .mypy_cache .ruff_cache .pytest_cache
