# One entry point for set-up, tests, the demo and the benchmarks. Every target installs what
# it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: setup setup-demo test lint unit demo docs bench fuzz simulate chaos infra-up infra-down clean \
	chart-tools image-check console-screenshot sdk-suite upgrade-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# What the demo runs: toolfleet and its agents extra (FleetRunner, for the README's path).
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[agents]'
	touch $(DEMO_STAMP)

## setup-demo: what the demo and the README's five-minute path need: the virtualenv with
## toolfleet[agents], redis-server, Kafka jars; then start Kafka and Redis (no test tools)
setup-demo: $(DEMO_STAMP)
	bash scripts/install-redis.sh
	$(BIN)/toolfleet infra up

## setup: virtualenv, Python packages, redis-server, chromium and the OIDC provider (npm; the
## console's browser and login tests), the TypeScript MCP SDK (npm; the MCP door's tests),
## Kafka jars; then start Kafka and Redis
setup: $(STAMP)
	bash scripts/install-redis.sh
	bash scripts/install-chromium.sh
	sh scripts/install-oidc-provider.sh
	sh scripts/install-mcp-ts.sh
	$(BIN)/toolfleet infra up

## chart-tools: helm and kubeconform (go install), etcd (Debian), kube-apiserver (built from
## Go modules, about 5 minutes once) and the KEDA/Prometheus Operator CRDs, for the chart tests
chart-tools:
	bash scripts/install-chart-tools.sh
	bash scripts/install-kube-test-tools.sh

## image-check: the Dockerfile's steps without Docker: every wheel built, installed offline
## into a fresh virtualenv, and the entrypoint run (needs PyPI; CI runs it)
image-check:
	rm -rf .image-check && $(PYTHON) -m venv .image-check/venv
	. .image-check/venv/bin/activate && docker/steps.sh wheels .image-check/wheels \
	  && docker/steps.sh install .image-check/wheels && docker/steps.sh check
	rm -rf .image-check

## lint: ruff, mypy, the layer contracts (lint-imports, configured in pyproject.toml) and
## luacheck on the stores' Lua scripts (.luacheckrc; Debian's lua-check, installed here)
lint: $(STAMP)
	sh scripts/apt-install.sh luacheck lua-check \
	  "install luacheck (e.g. luarocks install luacheck) for the Lua scripts' lint."
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	luacheck -q .

## test: everything CI runs: lint, unit tests, integration tests against real Kafka and a
## single Redis, then the integration tests again with a 3-master Redis Cluster as the state
## (tests about one server's client, that bring their own cluster, long fleet scenarios,
## Agents SDK applications on FleetRunner and tests that do not depend on the state's layout
## (local infrastructure, topics, the consume loop, the demo, the console, traces) run in the
## first pass only)
test: setup lint chart-tools
	$(BIN)/pytest -q --durations=25 --ignore=tests/upgrade
	TOOLFLEET_TEST_REDIS=cluster $(BIN)/pytest -q --durations=15 tests/integration \
	  -m "integration and not single_redis and not own_cluster and not long_scenario \
	      and not agent_runtime and not layout_free"

## upgrade-check: a rolling upgrade from the baseline release (kernel/stores/baseline.toml,
## checked out as a git worktree) with calls in flight, on a single Redis and on the 3-master
## cluster, replacing the services in two orders (tests/upgrade/; about 2 minutes)
upgrade-check: setup
	$(BIN)/pytest -q -s --durations=4 tests/upgrade

## unit: the tests that need no broker
unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

## demo: the end-to-end demo (model response in, turn result out)
demo: setup-demo
	$(BIN)/toolfleet demo

## docs: the documentation site (MkDocs, docs/) into .artifacts/site/, built strictly: a broken
## link or a page left out of the nav fails it (make test builds it too, tests/docs/)
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

## bench: the benchmarks (prints a table, writes bench/results/latest.md; BENCH_ARGS=--docs
## also refreshes the numbers in docs/benchmarks.md, BENCH_ARGS=--quick is a 3-minute smoke
## run). The peers' servers are installed first: the Temporal CLI (go install, about 5 minutes
## the first time) and Debian's postgresql for DBOS. (a)'s toolfleet rows also run at commit
## BENCH_BASELINE (the report's before and after; BENCH_BASELINE= leaves it out).
BENCH_BASELINE ?= 4da064b
bench: setup
	test $(VENV)/.bench-installed -nt pyproject.toml || \
	  { $(BIN)/python -m pip install -q -e '.[dev,bench]' && touch $(VENV)/.bench-installed; }
	sh scripts/install-temporal.sh
	sh scripts/install-postgres.sh
	$(BIN)/python -m bench --baseline=$(BENCH_BASELINE) $(BENCH_ARGS)

## bench-kafka: aiokafka as configured, aiokafka tuned and confluent-kafka (librdkafka, its
## asyncio API) on toolfleet's record shape against the local broker; prints the tables
## (bench/results/kafka-clients.md; BENCH_ARGS=--reps 5, not part of make test or make bench)
.PHONY: bench-kafka
bench-kafka: setup
	test $(VENV)/.bench-installed -nt pyproject.toml || \
	  { $(BIN)/python -m pip install -q -e '.[dev,bench]' && touch $(VENV)/.bench-installed; }
	$(BIN)/python -m bench.kafka_clients $(BENCH_ARGS)

## bench-mcp: the MCP front door against FleetClient, the same one-call turn both ways in one
## run: idle p50/p99 and calls/s under 50 callers (bench/results/mcp-door.md; about 2 minutes)
.PHONY: bench-mcp
bench-mcp: setup
	$(BIN)/python -m bench.mcp_door $(BENCH_ARGS)

## bench-console: the console's history at 100,000 turns: search pages and a run view over
## HTTP (p50/p95), the console's RSS, Redis's memory (bench/results/console-history.md;
## about 2 minutes)
.PHONY: bench-console
bench-console: setup
	$(BIN)/python -m bench.console_history $(BENCH_ARGS)

## bench-overview: the console's overview job against faust-streaming (pinned, in a virtualenv
## of its own, .artifacts/faust-venv) over the same 200,000 call outcomes: wall time, CPU,
## RSS, faust's topics, counts checked (bench/results/overview-aggregates.md; about 10 minutes)
.PHONY: bench-overview
bench-overview: setup
	$(BIN)/python -m bench.overview_aggregates $(BENCH_ARGS)

## fuzz: 5,000 hostile messages on every inbound topic; prints the figures
fuzz: setup
	TOOLFLEET_FUZZ_MESSAGES=5000 $(BIN)/pytest -q -s tests/integration/test_fuzz.py

## simulate: the deterministic simulator's campaign (SEEDS=100000 for the long one; FAULTS=a,b
## to pick fault kinds; JOURNAL=file records finished seeds there, and the same command again
## goes on after them); prints faults injected, states reached and a replay command per failure
SEEDS ?= 1000
simulate: setup
	$(BIN)/python -m toolfleet.testing.sim --seeds $(SEEDS) $(if $(FAULTS),--faults "$(FAULTS)") $(if $(JOURNAL),--journal "$(JOURNAL)")

## chaos: 3,000 charges while workers are SIGKILLed; prints the figures
chaos: setup
	TOOLFLEET_CHAOS_TURNS=600 TOOLFLEET_CHAOS_INFRA_KILLS=1 $(BIN)/pytest -q -s tests/integration/test_chaos.py

## console-screenshot: the console's browser tests, writing the live page's, a run view's and
## the overview's screenshots to docs/console.png, console-run.png (the README's) and
## console-overview.png
console-screenshot: setup
	TOOLFLEET_CONSOLE_SCREENSHOTS=docs $(BIN)/pytest -q tests/integration/test_console_browser.py

SDK_VENV := .artifacts/sdk-suite/venv

$(SDK_VENV)/.installed: pyproject.toml
	test -x $(SDK_VENV)/bin/python || $(PYTHON) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/python -m pip install -q --upgrade pip
	$(SDK_VENV)/bin/python -m pip install -q -e '.[sdk-suite]'
	touch $(SDK_VENV)/.installed

## sdk-suite: openai-agents 0.24.0's own tests that call the runner (its PyPI sdist, sha256
## pinned), in-process and on FleetRunner with an InProcessFleet; writes docs/sdk-suite.md and
## fails below the floor in tests/sdk_suite/causes.toml, or when one of the SDK's examples
## (tests/sdk_suite/examples) runs differently (a virtualenv of its own: the
## sdk-suite extra, the SDK's test tools)
sdk-suite: setup-demo $(SDK_VENV)/.installed
	$(BIN)/python -m tests.sdk_suite --python $(SDK_VENV)/bin/python run

infra-up: setup

infra-down: $(STAMP)
	$(BIN)/toolfleet infra down

clean: infra-down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
