# Arona developer commands. Every target bootstraps itself: it needs only Python 3.11+
# and pip. If `uv` is not on PATH it is installed into .tools/ first.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.tools/bin/uv)
RUN := $(UV) run --frozen

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(CURDIR)/.tools/bin/uv:
	$(PYTHON) -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/pip install --quiet --disable-pip-version-check uv

.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen
	@touch $@

.PHONY: install
install: .venv/.synced ## Install the project and dev tools into .venv (uv sync)

.PHONY: demo
demo: install ## First run: SQLite + in-memory state on 127.0.0.1:8420 with demo credentials
	$(RUN) arona demo

.PHONY: serve
serve: install ## Serve with the configured ARONA_* settings (run `make migrate` first)
	$(RUN) arona serve

.PHONY: migrate
migrate: install ## Apply database migrations to ARONA_DATABASE_URL
	$(RUN) arona migrate

CHROMIUM ?= /usr/bin/chromium

.PHONY: browser
browser: install ## Install a Chromium for the browser tests if missing: Debian's package, else Playwright's build
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser tests"; \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
		else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; \
	else \
		echo "no apt-get: installing Playwright's Chromium for the browser tests"; \
		$(RUN) playwright install chromium; \
	fi

.PHONY: test
test: install browser ## Run the whole suite (needs PostgreSQL and Redis on localhost; installs Chromium if missing)
	$(RUN) pytest

.PHONY: schemathesis
schemathesis: install ## Fuzz every documented operation of a live server on PostgreSQL + Redis (~5 min)
	$(RUN) python scripts/schemathesis_job.py $(SCHEMATHESIS_ARGS)

.PHONY: check
check: install ## Lint, format check and type check
	$(RUN) ruff check app tests migrations bench scripts
	$(RUN) ruff format --check app tests migrations bench scripts
	$(RUN) mypy app tests bench scripts

.PHONY: format
format: install ## Apply ruff formatting and safe fixes
	$(RUN) ruff format app tests migrations bench scripts
	$(RUN) ruff check --fix app tests migrations bench scripts

.PHONY: screenshots
screenshots: install browser ## Screenshots for docs/console.md (run `make demo` in another terminal first)
	$(RUN) python scripts/console_screenshots.py

.PHONY: bench
bench: install ## Side-by-side benchmark: direct vs Arona vs LiteLLM (~8 min; BENCH_ARGS=--quick)
	$(RUN) python -m bench $(BENCH_ARGS)

.PHONY: bench-routing
bench-routing: install ## Routing quality: simulated engines, baselines, oracles and live Arona (~40 min; BENCH_ARGS=--quick)
	$(RUN) python -m bench.routing $(BENCH_ARGS)

.PHONY: bench-gc
bench-gc: install ## Collector pauses and CPU on the success and upstream-error paths (~6 min)
	$(RUN) python -m bench.gc $(BENCH_ARGS)

.PHONY: bench-login
bench-login: install ## Failed-login timing: wrong password vs unknown email (~30 s)
	$(RUN) python -m bench.login_timing

.PHONY: clean
clean: ## Remove local caches and the demo data dir
	rm -rf .pytest_cache .mypy_cache .ruff_cache .arona
