# placer — one Makefile: install, test, lint, bench, demo.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint bench demo clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . pytest hypothesis ruff mypy types-PyYAML jsonschema matplotlib safetensors
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check placer tests bench
	$(BIN)/mypy placer

bench: $(STAMP)
	$(BIN)/python -m bench

demo: $(STAMP)
	$(BIN)/python -m placer.cli.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out
