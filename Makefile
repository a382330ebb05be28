# babelprobe: `make setup` then `make test` on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CI and this README install this exact torch first: on a machine with a local CPU wheel it takes that,
# elsewhere it is PyPI's build. Use `make setup TORCH=torch` (or any spec) to choose your own.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup test test-fast lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,perf]"
	touch $@

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check babelprobe tests perf

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
