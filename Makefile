# babelprobe: `make setup` then `make test` on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CI and this README install this exact torch first: on a machine with a local CPU wheel it takes that,
# elsewhere it is PyPI's build. Use `make setup TORCH=torch` (or any spec) to choose your own.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# The suite runs in parallel (pytest-xdist): a worker per physical core, at most 4, each test sent to the
# first free worker; each worker's torch takes its share of the threads (tests/conftest.py). On the
# 2-core machine pytest takes ~10 min instead of ~16. `make test PARALLEL=` runs it in one process. Tests
# marked serial (pyproject.toml) run after the others, in one process.
PARALLEL ?= -n auto --maxprocesses 4 --dist worksteal

# The numeric tests (tests/numeric.py) again under each other CPU kernel family torch has, so a tolerance
# that only this machine's kernels meet fails here and not on a user's machine.
KERNELS ?= default avx2

.PHONY: setup test test-fast test-numeric lint stress clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,perf]"
	touch $@

test: setup
	$(BIN)/python -m pytest $(PARALLEL) -m "not serial" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-numeric

test-numeric: setup
	@for kernels in $(KERNELS); do \
		echo "numeric tests under ATEN_CPU_CAPABILITY=$$kernels"; \
		ATEN_CPU_CAPABILITY=$$kernels $(BIN)/python -m pytest -m numeric -q $(PARALLEL) $(PYTEST_ARGS) || exit 1; \
	done

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not serial" $(PARALLEL) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "serial and not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check babelprobe tests perf

# SIGKILL an extraction at 20 random moments (make test runs 3); KILL_SEED picks other moments
KILL_SEED ?= 0
stress: setup
	BABELPROBE_KILLS=20 BABELPROBE_KILL_SEED=$(KILL_SEED) $(BIN)/python -m pytest tests/test_kill.py -q -s $(PYTEST_ARGS)

# ---- research runs (README "Demo, sweeps and figures"); results/ is git-ignored
BP := $(BIN)/babelprobe
# demo: meta, direct and neuro on the default model, two languages of each typology class, 10 pairs per
# language x subset (240 pairs; a few CPU minutes). DEMO_ARGS="" runs all 2,720 sample pairs.
DEMO_OUT ?= results/demo
DEMO_ARGS ?= --languages en,zh,de,ru,ja,tr --limit 10
# sweep: extraction, probes (with transfer) and the report for any model and item set; resumable.
MODEL ?= default
ITEMS ?= xcomps-sample
LANGS ?=
LIMIT ?=
BACKEND ?= hf
OUT ?= results/sweep
EXTRACT_ARGS ?=
PROBE_ARGS ?=
# figures: re-export the figures and report.md of a results directory.
RESULTS ?= $(DEMO_OUT)

.PHONY: demo sweep figures

demo: setup
	$(BP) compare --model default --items xcomps-sample $(DEMO_ARGS) --out $(DEMO_OUT) --no-progress
	$(MAKE) --no-print-directory $(DEMO_OUT)/transfer/neuro.csv
	$(BP) report --results $(DEMO_OUT) --out $(DEMO_OUT)/figures
	@echo "demo: tables in $(DEMO_OUT), figures and report.md in $(DEMO_OUT)/figures"

# the demo's transfer probes, redone only when the activation store changed
$(DEMO_OUT)/transfer/neuro.csv: $(DEMO_OUT)/acts/manifest.json
	$(BP) probe --acts $(DEMO_OUT)/acts --out $@ --transfer --no-progress

# Extraction resumes by itself; probing reruns only when the store is newer than neuro.csv (written last,
# so an interrupted probe reruns), the report only when neuro.csv is newer than report.md (written last).
sweep: setup
	$(BP) extract --model $(MODEL) --items $(ITEMS) $(if $(LANGS),--languages $(LANGS)) \
		$(if $(LIMIT),--limit $(LIMIT)) --backend $(BACKEND) --out $(OUT)/acts $(EXTRACT_ARGS)
	$(MAKE) --no-print-directory $(OUT)/figures/report.md

$(OUT)/neuro.csv: $(OUT)/acts/manifest.json
	$(BP) probe --acts $(OUT)/acts --out $@ --transfer $(PROBE_ARGS)

$(OUT)/figures/report.md: $(OUT)/neuro.csv
	$(BP) report --results $(OUT) --out $(OUT)/figures

figures: setup
	$(BP) report --results $(RESULTS) --out $(RESULTS)/figures

# paper-xcomps: every XCOMPS figure and table (Figs. 2-6, 10-14, Tables 4-5 style; docs/fidelity.md) of a
# compare directory made with --protocol paper; OTHER=DIR (a second model, same items) adds Figs. 9 and 13.
OTHER ?=
PROTOCOL ?= paper
.PHONY: paper-xcomps
paper-xcomps: setup
	$(BP) report --results $(RESULTS) --out $(RESULTS)/paper-xcomps --protocol $(PROTOCOL) $(if $(OTHER),--other $(OTHER))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
