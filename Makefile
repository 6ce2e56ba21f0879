# placer — one Makefile: install, test, lint, bench, demo.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow test-setup test-engine lint bench demo shell clean

# the ray extra too: the Ray backend's tests run (and must pass) on every `make test`
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[ray]' pytest pytest-xdist hypothesis ruff mypy types-PyYAML jsonschema matplotlib safetensors
	touch $(STAMP)

install: $(STAMP)

# the fast tier, over every core; the slow tier (make test-slow) runs in CI (.ci/run)
test: $(STAMP)
	$(BIN)/pytest -q -n auto -m "not slow"

test-slow: $(STAMP)
	$(BIN)/pytest -q -n auto -m slow

# what the slow tier drives besides Python: headless Chromium for the report pages' tests
# (Debian's package; root on a Debian machine, as CI is)
test-setup:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)

# the engine tier: placer's vLLM plugin against the released vllm (pinned), installed once
# into its own cached environment outside the repo ($$PLACER_ENGINE_VENV, default
# ~/.cache/placer/vllm-0.33.0); PLACER_REQUIRE_VLLM=1 fails where vllm cannot be installed
test-engine:
	PY=$(PY) tests/engine/run.sh

lint: $(STAMP)
	$(BIN)/ruff check placer tests bench
	$(BIN)/mypy placer

bench: $(STAMP)
	$(BIN)/python -m bench

demo: $(STAMP)
	$(BIN)/python -m placer.cli.demo

# a shell with .venv's placer on PATH (the README's tour types `placer ...`); exit to leave
shell: $(STAMP)
	@echo "placer is on PATH in this shell ($(VENV) activated); type exit to leave"
	@VIRTUAL_ENV="$(CURDIR)/$(VENV)" PATH="$(CURDIR)/$(BIN):$$PATH" $${SHELL:-/bin/sh} -i

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out
